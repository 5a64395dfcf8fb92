"""Kernel categories: real kernel names per category, "other" under 5% of kernel time on real traces, plugin rows.

The names below are copied from the shared real traces (../shared/samples/torch: an 8-layer bf16 transformer,
a torch.compile CUDA-graph ResNet18, two-GPU DataParallel runs, ResNet50 with memory profiling) and from the
public ROCm traces named in the research notes (MI250/MI300X: rocBLAS/hipBLASLt, MIOpen, Composable Kernel,
RCCL), and XLA's names from the JAX captures (fixtures/jax: H100 and MI300X). The "other" shares are computed from the raw JSON (exact decimal microseconds), not through the reader.
"""

from __future__ import annotations

import gzip
import re
import json
from decimal import Decimal
from pathlib import Path

import polars as pl
import pytest

from helpers import REPO, us_to_ns
from traceparse import expr
from traceparse.plugins import hookimpl, reset_registry

SHARED = REPO.parent / "shared" / "samples" / "torch"

NAMES = {
    "gemm": [
        # TensorRT-LLM / FlashInfer MoE batched GEMMs (MXFP4 weights) on a B200 (AMD-AGI/TraceLens
        # tests/traces/b200/eager_trace.json.gz, MIT: vLLM), and a WMMA tensor-core GEMM's ncu name
        "bmm_MxE4m3_MxE2m1MxE4m3_Fp32_t128x16x256u2_s3_et128x16_m128x16x32_cga1x1x1_16dp256b_rM_TN_transOut_schedP2x1x2x3_biasM_bN_tma_tmaOpt_clmp_swiGlu_dynBatch_sm100f",
        "bmm_Bfloat16_MxE2m1MxE4m3_Fp32_t128x16x256u2_s3_et128x16_m128x16x32_cga1x1x1_16dp256b_rM_TN_transOut_schedP2x1x2x3_biasM_bN_tmaOpt_clmp_dynBatch_sm100f",
        "wmma_db",
        # (fixtures/torch/hta/trace_filter: an A100's cutlass and cuBLAS SGEMMs beside FBGEMM's kernels)
        "void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_128x64_32x6_nt_align1>(cutlass_80_tensorop_s1688gemm_128x64_32x6_nt_align1::Params)",
        "ampere_sgemm_128x64_nn",
        "fbgemm_gpu::bf16_gemm_kernel",  # hand-written: a GEMM under FBGEMM's namespace stays one
        "nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT",
        "nvjet_sm90_tst_128x192_64x5_2x1_v_bz_coopB_NTN",
        "sm90_xmma_gemm_f32f32_tf32f32_f32_tn_n_tilesize64x128x32_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_cublas",
        "void cutlass::Kernel2<cutlass_80_tensorop_s1688gemm_128x128_16x6_nn_align4>(cutlass_80_tensorop_s1688gemm_128x128_16x6_nn_align4::Params)",
        "void cutlass::Kernel2<cutlass_80_simt_sgemm_128x32_8x5_nn_align1>(cutlass_80_simt_sgemm_128x32_8x5_nn_align1::Params)",
        "void cublasLt::splitKreduce_kernel<32, 16, int, float, float, float, float, false, float, float, float, true, false, false, false>(cublasLt::cublasSplitKParams<float>, float const*)",
        "triton_tem_fused_addmm_relu_0",
        "Cijk_Alik_Bljk_SB_Bias_AS_SAV_UserArgs_MT64x16x32_MI16x16x1_SN_LDSB0_AFC1",
        "Cijk_Ailk_Bljk_BBS_BH_MT128x128x64_MI16x16x16x1_SN_1LDSB0_APM1",
        "gemm_fusion_dot_17",  # XLA (fixtures/jax/jax_gpt, H100) and its ROCm twin (fixtures/jax/public, MI300X)
        "gemm_fusion_dot_general_1.kd",
    ],
    "convolution": [
        # cuDNN's FFT convolutions on an A100 (HTA tests/data/critical_path/alexnet, MIT)
        "void fft2d_r2c_32x32<float, false, 5u, true>(float2*, float const*, int, int, int, int, int, int, int, int, int, cudnn::reduced_divisor, bool, int2, int, int)",
        "void fft2d_c2r_32x32<float, false, false, 0u, false, false>(float*, float2 const*, int, int, int, int, int, int, int, int, int, float, float, cudnn::reduced_divisor, bool, float*, float*, int2, int, int)",
        # cuDNN 7 on a V100 (an nvprof --print-gpu-trace of torch.nn.Conv2d, and an ncu report of a V100): the
        # "relu" of the name is a fused epilogue, not an elementwise kernel
        "volta_scudnn_128x64_relu_interior_nn_v1",
        "volta_h884cudnn_256x64_sliced1x2_ldg8_relu_exp_small_nhwc_tn_v1",  # hand-written, cuDNN 7's fp16 form
        "sm90_xmma_wgrad_indexed_implicit_gemm_f32f32_tf32f32_f32_nhwckrsc_nhwc_tilesize128x128x32_warpgroupsize1x1x1_g1_execute_segment_k_on_kernel__5x_cudnn",
        "sm90_xmma_dgrad_implicit_gemm_f32f32_tf32f32_f32_nhwckrsc_nhwc_tilesize128x64x32_warpgroupsize1x1x1_g1_execute_segment_k_off_kernel__5x_cudnn",
        "sm80_xmma_fprop_implicit_gemm_tf32f32_tf32f32_f32_nhwckrsc_nchw_tilesize128x64x32_stage5_warpsize2x2x1_g1_tensor16x8x8_execute_kernel__5x_cudnn",
        "_ZN17cutlass__5x_cudnn6KernelINS_4conv6kernel23ImplicitGemmConvolutionINS1_11threadblock22ImplicitGemmMultistageINS_4gemm9GemmShapeILi64ELi128ELi16EEE",
        "void cutlass__5x_cudnn::Kernel<cutlass_tensorop_s1688dgrad_optimized_tf32_256x64_16x4_nhwc_unity_stride_align4>(cutlass_tensorop_s1688dgrad_optimized_tf32_256x64_16x4_nhwc_unity_stride_align4::Params)",
        "void cudnn::detail::dgrad_engine<float, 512, 6, 5, 3, 3, 3, false>(int, int, int, float const*, int)",
        "void cask_plugin__5x_cudnn::xmma__5x_cudnn::init_device_workspace_kernel<xmma__5x_cudnn::implicit_gemm::wgrad_indexed::Warp_specialized_params<xmma__5x_cudnn::Grid_constant_params> >(xmma__5x_cudnn::i",
        "igemm_fwd_gtcx3_nhwc_bf16_bx0_ex1_bt128x128x32_wt32x32x8_ws2x1_wr2x2",
        "igemm_wrw_gtcx2_nhwc_fp16_bx0_ex0_bt256x128x16_wt32x32x8_ws2x1_wr2x2",
        "_ZN2ck16tensor_operation6device43kernel_grouped_conv_fwd_xdl_cshuffle_v3",
        "naive_conv_fwd_nchw_float_double_float",
    ],
    "attention": [
        "cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma_f16_knob_26_64x64x64_1x4x1_cga1x1x1_kernel0_0",
        "cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_7_64x128x64_4x1x1_cga1x1x1_kernel0_0",
        "void cudnn::fusion::compute_dot_do_o_specialized<true, 64>(void const*, void const*, void*, void*, unsigned int)",
        "void cudnn::fusion::convert_dq_to_16bits<true>(void const*, void*, unsigned int, unsigned int)",
        "void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<64, 128, 128, 4, false, false, cutlass::half_t> >(pytorch_flash::Flash_fwd_params)",
        "fmha_cutlassF_f16_aligned_64x64_rf_sm80(PyTorchMemEffAttention::AttentionKernel<cutlass::half_t>::Params)",
        "_ZN7ck_tile6kentryILi64ELi1ENS_13FmhaFwdKernel",
        "attn_fwd",
    ],
    "normalization": [
        "void at::native::(anonymous namespace)::GammaBetaBackwardCUDAKernelTemplate<float, float, 32u, 32u, 256u, false, true, false>(long, long, float const*)",
        "void at::native::(anonymous namespace)::layer_norm_grad_input_kernel_vectorized<float, float, false>(float const*, float const*)",
        "void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<float, float, false>(int, float, float const*)",
        "void cudnn::bn_bw_1C11_kernel_new<float, float, float2, 512, true, 1>(float, float, float, float, cudnnTensorStruct)",
        "void cudnn::bn_fw_tr_1C11_singleread<float, 512, true, 1, 2, 0>(cudnn::bn_fw_tr_1C11_args<float>)",
        "triton_red_fused_native_batch_norm_backward_threshold_backward_37",
        "triton_poi_fused_convolution_backward_native_batch_norm_backward_threshold_backward_40",
        "MIOpenBatchNormFwdTrainSpatial",
        "MIOpenBatchNormBwdSpatial",
    ],
    "elementwise": [
        # cuDNN's RNN kernels (fixtures/torch/sweep18/lstm_gru: LSTM and GRU on an H200): the cell's gates, and the
        # backward's second part, whose fast-division parameter cudnn::reduced_divisor is no reduction
        "void elemWiseRNNcell<float, float, float, (cudnnRNNMode_t)2, (cudnnRNNBiasMode_t)2>(int, int, int, int, int, bool, float const*, float const*, float const*, float const*, float const*, float const*, float const*, float*, float*, float*, float*, float*, cudnnRNNClipMode_t, cudnnNanPropagation_t, float, float)",
        "void GRU_elementWise_bp2<float, float, float, 3, (cudnnRNNBiasMode_t)2>(int, int, float*, float*, cudnn::reduced_divisor, float*)",
        "void GENERIC_elementWise_bp2<float, float, float, 4, (cudnnRNNBiasMode_t)2>(int, int, float*, float*, cudnn::reduced_divisor, float*)",
        # TensorRT-LLM's block-scale quantization (the B200 trace): its flashinfer:: template argument is no attention
        "void tensorrt_llm::kernels::quantize_with_block_size<(tensorrt_llm::BlockScaleQuantizationType)2, __nv_bfloat16, 32, true>(int, int, int, int, __nv_bfloat16 const*, float const*, unsigned int*, unsigned int*, flashinfer::QuantizationSFLayout)",
        # FBGEMM's FP8 (de)quantization (fixtures/torch/hta/trace_filter)
        "void fbgemm_gpu::(anonymous namespace)::_compute_FP8_quantize_cuda_kernel<float>(float const*, float const*, int, int, unsigned char*, bool)",
        "void fbgemm_gpu::(anonymous namespace)::_FP8rowwise_to_float_cuda_kernel<float>(unsigned char const*, int, int, float*, bool)",
        "void fbgemm_gpu::(anonymous namespace)::_get_FP8_qparam_cuda_kernel<float>(float const*, int, int, unsigned char*, float*, bool)",
        "void at::native::vectorized_elementwise_kernel<4, fbgemm_gpu::_hfp8_to_float_gpu(at::Tensor const&, long, long)::{lambda(unsigned char)#1}, at::detail::Array<char*, 2> >(int)",
        "void at::native::vectorized_elementwise_kernel<8, at::native::CUDAFunctor_add<c10::BFloat16>, std::array<char*, 3ul> >(int, at::native::CUDAFunctor_add<c10::BFloat16>, std::array<char*, 3ul>)",
        "void at::native::vectorized_elementwise_kernel<8, at::native::GeluBackwardCUDAKernelImpl(at::TensorIteratorBase&, at::native::GeluType)",
        "void at::native::(anonymous namespace)::fused_dropout_kernel_vec<c10::BFloat16, float, unsigned int, 1, 8, bool>(at::cuda::detail::TensorInfo<c10::BFloat16 const, unsigned int>)",
        "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, std::array<char*, 1ul> >(int, at::native::FillFunctor<float>, std::array<char*, 1ul>)",
        # cub's transform (thrust::sequence under the sparse EmbeddingBag gradient, fixtures/torch/sweep18)
        "void at_cuda_detail::cub::detail::transform::transform_kernel<at_cuda_detail::cub::detail::transform::policy_hub<true, cuda::std::__4::tuple<thrust::THRUST_300001_SM_750_800_860_900_1000_1200_NS::counting_iterator<long, thrust::THRU",
        "at::cuda::philox::unpack_cudnn(at::PhiloxCudaState, long*, long*)",
        "void at::native::triu_tril_kernel<float, int, true, 2, false>(at::cuda::detail::TensorInfo<float, int>)",
        "memset32",
        "loop_convert_tanh_fusion",  # XLA loop fusions and wrapped single ops (fixtures/jax)
        "loop_add_fusion_1",
        "wrapped_convert",
        "loop_convert_fusion.kd",
    ],
    "reduction/softmax": [
        # sweep 18 (fixtures/torch/sweep18, an H200): the sparse EmbeddingBag gradient's index sort (cub's merge
        # sort) and coalescing; the nested-tensor encoder's scan of the sequence lengths
        "void at_cuda_detail::cub::detail::merge_sort::DeviceMergeSortPartitionKernel<thrust::THRUST_300001_SM_750_800_860_900_1000_1200_NS::device_ptr<long>, unsigned int, at::native::LTOp<long, false>, long>(bool, thrust::THRUST_300001_SM_750_800_860_900_1000_1200_NS::device_ptr<long>, long*, unsigned int, unsigned int, unsigned int*, at::native::LTOp<long, false>, unsigned int, int)",
        "void at::native::apply::coalesceValuesKernel<float, float>(long*, long*, float*, float*, long, long, long)",
        "void at::native::tensor_kernel_scan_innermost_dim<long, std::plus<long> >(long*, long const*, unsigned int, unsigned int, unsigned int, long, std::plus<long>)",
        "void at::native::(anonymous namespace)::cunn_SoftMaxBackward<4, float, float, float, at::native::(anonymous namespace)::LogSoftMaxBackwardEpilogue>(float*, float const*, float const*, long)",
        "void at::native::reduce_kernel<128, 4, at::native::ReduceOp<c10::BFloat16, at::native::func_wrapper_t<c10::BFloat16, at::native::sum_functor<c10::BFloat16, float, c10::BFloat16>",
        "void at::native::(anonymous namespace)::nll_loss_forward_reduce_cuda_kernel_2d<float, float, long>(float*, float*, float const*)",
        "void (anonymous namespace)::softmax_warp_forward<float, float, float, 10, true, false>(float*, float const*, int, int, int, bool const*, int, bool)",
        "void at_cuda_detail::cub::detail::radix_sort::DeviceRadixSortOnesweepKernel<at_cuda_detail::cub::detail::radix::policy_hub<long, at::cuda::cub::detail::OpaqueType<8>, unsigned long long>::Policy1000, ",
        "void at_cuda_detail::cub::detail::scan::DeviceScanKernel<at_cuda_detail::cub::detail::scan::policy_hub<long, long, long, unsigned int>",
        "triton_per_fused__log_softmax_backward_data_nll_loss_backward_2",
        "triton_softmax_31",  # XLA (fixtures/jax/jax_gpt)
        "input_reduce_fusion_1",
        "loop_reduce_fusion.kd",
    ],
    "pooling": [
        "void at::native::(anonymous namespace)::max_pool_backward_nchw<float, float, int>(float const*, long const*, int)",
        "void at::native::(anonymous namespace)::atomic_adaptive_average_gradinput<float>(float*, float const*, int, int, int, int)",
        "triton_poi_fused_add_max_pool2d_with_indices_max_pool2d_with_indices_backward_36",
    ],
    "embedding": [
        "void at::native::vectorized_gather_kernel<16, long>(char*, char*, long*, int, long, long, long, long, bool)",
        "void at::native::(anonymous namespace)::sum_and_scatter<float, long>(long const*, float*, long, long const*)",
        "void at::native::(anonymous namespace)::compute_grad_weight<float, long>(long const*, float const*, long const*)",
        "void at::native::(anonymous namespace)::krn_partials_per_segment<long>(long*, long const*, long const*, long)",
        "void at::native::(anonymous namespace)::embedding_backward_feature_kernel<float, float, long>(long const*)",
        # FBGEMM (fixtures/torch/hta/trace_filter): "fbgemm" is no GEMM
        "void split_embedding_backward_codegen_rowwise_adagrad_unweighted_kernel_cta_per_row_1<c10::Half, float, c10::Half, 2ul, 32>(at::GenericPackedTensorAccessor<float, 1ul, at::RestrictPtrTraits, long>, fbgemm_gpu::FixedDivisor)",
        "void split_embedding_codegen_forward_unweighted_kernel<c10::Half, c10::Half, float, false, long, 2ul, 32ul>(at::GenericPackedTensorAccessor<c10::Half, 1ul, at::RestrictPtrTraits, long>, fbgemm_gpu::FixedDivisor)",
        "void bounds_check_indices_kernel<long, false>(at::GenericPackedTensorAccessor<long, 1ul, at::RestrictPtrTraits, int>)",
        "void linearize_index_kernel<long>(at::GenericPackedTensorAccessor<long, 1ul, at::RestrictPtrTraits, int>)",
    ],
    "optimizer": [
        "void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous namespace)::FusedOptimizerTensorListMetadata<4>, at::native::(anonymous namespace)::FusedAdamMathFunctor<float, 4, (at::native::ADAM_MODE)1, false>",
        "void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous namespace)::TensorListMetadata<2>, at::native::(anonymous namespace)::BinaryOpListAlphaFunctor<float, 2, 2, 0>,",
    ],
    "layout/copy": [
        # sweep 18: nn.TransformerEncoder's fast path turning padded batches into nested tensors and back
        "void at::native::remove_padding_2<c10::Half>(c10::Half const*, c10::Half*, int const*, int const*, int const*, int, int)",
        "void at::native::add_padding_2<c10::Half>(c10::Half const*, c10::Half*, c10::Half, int const*, int const*, int, int, int, int)",
        "void cudnn::engines_precompiled::nchwToNhwcKernel<float, float, float, false, true, (cudnnKernelDataType_t)0>(cudnn::engines_precompiled::nchw2nhwc_params_t<float>, float const*, float*)",
        "void cudnn::engines_precompiled::nhwcToNchwKernel<float, float, float, true, false, (cudnnKernelDataType_t)0>(cudnn::engines_precompiled::nhwc2nchw_params_t<float>, float const*, float*)",
        "void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)::{lambda()#3}::operator()() const::{lambda()#7}::operator()() const::{lambda(float)#1}, std::a",
        "void at::native::vectorized_elementwise_kernel<8, at::native::bfloat16_copy_kernel_cuda(at::TensorIteratorBase&)::{lambda(float)#1}, std::array<char*, 2ul> >(int, at::native::bfloat16_copy_kernel_cuda",
        "void cudnn::engines_precompiled::convertTensor_kernel<float, float, float, (cudnnKernelDataType_t)2>(float, float const*, float, float*, unsigned long)",
        "void nhwcAddPaddingKernel<float, float, float, true, (cudnnKernelDataType_t)2>(int, int, int, int, int, int, int, int, float const*, float*)",
        "batched_transpose_16x32_half",
        "void copy_kernel<double>(cublasCopyParams<T1>)",  # a public ncu log (RTX 4060 Laptop): cuBLAS level 1
        "transpose_NCHW2CNHW_V2_2D_WG_off64",
        "input_concatenate_fusion_3",  # XLA (fixtures/jax)
        "loop_transpose_fusion_17",
        "Im3d2Col.kd",
        "void permute_pooled_embs_kernel<float>(float const*, long const*, long const*, long const*, float*, long, long, long)",
        "void fbgemm_gpu::permute_2D_data_kernel<false, int, int, decltype(nullptr)>(int, int, int, int const*, decltype(nullptr) const*, int const*)",
        "void fbgemm_gpu::permute_indices_weights_kernel<false, int, decltype(nullptr)>(int, int, int const*, decltype(nullptr) const*)",
    ],
    "communication": [
        # PyTorch's symmetric-memory all-reduce (the B200 vLLM trace above), and hand-written names of its
        # siblings, vLLM's custom all-reduce and TensorRT-LLM's, as their sources spell them
        "void (anonymous namespace)::multimem_all_reduce_kernel<c10::BFloat16, 16>(c10::BFloat16*, unsigned long, unsigned int**, unsigned long, unsigned long)",
        "void c10d::symmetric_memory::one_shot_all_reduce_kernel<float, 16, 8>(float*, unsigned long, float**, unsigned long, unsigned long, unsigned int**, unsigned long, unsigned long)",
        "void vllm::cross_device_reduce_1stage<__nv_bfloat16, 8>(vllm::RankData*, vllm::RankSignals, vllm::Signal*, __nv_bfloat16*, int, int)",
        "void tensorrt_llm::kernels::ar_fusion::allreduce_fusion_kernel_oneshot_lamport<(tensorrt_llm::kernels::AllReduceFusionPattern)1, __nv_bfloat16, 8, false>(tensorrt_llm::kernels::ar_fusion::AllReduceFusionParams)",
        "ncclDevKernel_Broadcast_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
        "ncclDevKernel_Reduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
        "ncclDevKernel_Generic(ncclDevKernelArgsStorage<4096ul>)",
        "ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)",
        # XLA's collectives by their HLO opcode names (xla/hlo/ir/hlo_opcode.h spellings, as hlo_op and the XLA
        # Ops line write them): no capture of several GPUs was at hand
        "all-reduce-start.1",
        "all-gather-done",
        "reduce-scatter.3",
        "collective-permute-start",
    ],
    "triton-fused": [
        "triton_poi_fused_add_threshold_backward_32",
        "triton_poi_fused_1",
        "triton_red_fused_sum_7",
        "triton_poi_fused_add_copy__35",
    ],
}

#: Kernel time in "other" (ns) and all kernel time (ns) per shared trace, from the raw JSON: before this table
#: (gemm/conv, normalization, pooling, reduction, elementwise, communication) and now.
OTHER = {
    "dp2_alexnet_bs16.json.gz": (497_306, 0, 12_214_914),
    "dp2_resnet18_bs16.json.gz": (2_241_640, 0, 13_181_656),
    "gpt_1024d_8l_bs8_bf16.json.gz": (29_740_323, 0, 90_237_920),
    "resnet18_bs32_compiled_cudagraphs.json.gz": (388_237, 0, 15_788_478),
    "resnet50_bs32_memory.json.gz": (4_464_514, 0, 38_914_205),
    "torch_resnet18_bs16.json.gz": (1_769_416, 0, 9_122_627),
    "torch_resnet18_bs4.json.gz": (880_915, 0, 4_246_951),
    "torch_resnet18_bs64.json.gz": (5_503_145, 0, 28_202_352),
}
OLD_TABLE = [
    ("communication", r"nccl"),
    ("normalization", r"batch_?norm|layer_?norm|group_?norm|instance_?norm|rms_?norm|\bbn_(fw|bw)|::bn_|welford"),
    ("pooling", r"pool"),
    ("gemm/conv", r"gemm|gemv|conv|cutlass|xmma|wgmma|hmma|winograd|dgrad|wgrad|fprop|matmul|splitkreduce|cublas"
                  r"|s1688|h1688|s884|h884|s16816|h16816|implicit_convolve"),
    ("reduction", r"reduce|reduction|softmax|nll_loss|cross_entropy|argmax|argmin|topk|cumsum|scan_kernel"),
    ("elementwise", r"elementwise|vectorized|multi_tensor_apply|foreach|fill|copy|threshold|relu|sigmoid|tanh"
                    r"|gelu|silu|dropout|clamp|scale|add_kernel|mul_kernel|cast"),
]


def categories(names: list[str], table=None) -> list[str]:
    return pl.select(expr.kernel_category(pl.lit(pl.Series(names, dtype=pl.String)), table)).to_series().to_list()


@pytest.mark.parametrize("category", sorted(NAMES))
def test_real_names_get_their_category(category):
    got = dict(zip(NAMES[category], categories(NAMES[category])))
    assert {n: c for n, c in got.items() if c != category} == {}


def test_every_category_has_real_names():
    assert set(NAMES) | {expr.OTHER_CATEGORY} == set(expr.KERNEL_CATEGORY_NAMES)


def kernel_time_by_name(path: Path) -> dict[str, int]:
    """Kernel name -> total exact ns, from the raw JSON (cat "kernel", complete events)."""
    with gzip.open(path, "rt", encoding="utf-8") as f:
        doc = json.load(f, parse_float=Decimal)
    out: dict[str, int] = {}
    for e in doc["traceEvents"]:
        if e.get("ph") == "X" and str(e.get("cat", "")).lower() == "kernel":
            out[e["name"]] = out.get(e["name"], 0) + us_to_ns(e["dur"])
    return out


@pytest.mark.skipif(not SHARED.is_dir(), reason="the shared samples are not next to the repository")
@pytest.mark.parametrize("name", sorted(OTHER))
def test_other_is_under_5_percent_of_kernel_time(name):
    times = kernel_time_by_name(SHARED / name)
    names = sorted(times)
    total = sum(times.values())
    old = sum(times[n] for n, c in zip(names, categories(names, OLD_TABLE)) if c == "other")
    new = sum(times[n] for n, c in zip(names, categories(names)) if c == "other")
    assert (old, new, total) == OTHER[name]
    assert 100 * new / total < 5


def test_cudnn_rnn_kernels_leave_nothing_in_other():
    """Sweep 18's LSTM/GRU capture: cuDNN's elemWiseRNNcell kernels (5.1% of kernel time) were "other", and its
    elementWise_bp2 kernels a reduction for the cudnn::reduced_divisor parameter of their signatures. Raw JSON."""
    times = kernel_time_by_name(REPO / "fixtures" / "torch" / "sweep18" / "lstm_gru.json.gz")
    names = sorted(times)
    got = dict(zip(names, categories(names)))
    assert [n for n in names if got[n] == "other"] == []
    cudnn = {n: got[n] for n in names if "RNN" in n or "elementWise" in n}
    assert len(cudnn) == 6 and set(cudnn.values()) == {"elementwise"}
    assert sum(times[n] for n in cudnn) == 2_642_641  # ns: 12.5% of the 21,131,429 ns of kernel time


@pytest.mark.parametrize("name, kernels", [("embbag_sparse", 438), ("infer", 400), ("amp_accum", 601),
                                           ("repeat2_cycle1", 36)])
def test_the_sweep18_captures_leave_nothing_in_other(name, kernels):
    """Sparse embedding gradients (cub merge sorts, coalesceValuesKernel, a cub transform: 666,049 of 4,299,759 ns,
    15.5% of the embbag capture's kernel time) and nested-tensor padding and scans (171,646 of 2,531,493 ns, 6.8%
    of the encoder's) were "other". Raw JSON."""
    times = kernel_time_by_name(REPO / "fixtures" / "torch" / "sweep18" / f"{name}.json.gz")
    names = sorted(times)
    got = dict(zip(names, categories(names)))
    assert [n[:60] for n in names if got[n] == "other"] == []
    with gzip.open(REPO / "fixtures" / "torch" / "sweep18" / f"{name}.json.gz", "rt") as f:
        assert sum(1 for e in json.load(f)["traceEvents"] if e.get("cat") == "kernel") == kernels


def test_a_plugin_row_comes_first():
    class Plugin:
        @hookimpl
        def traceparse_kernel_categories(self):
            return [("my-library", r"^mylib_"), ("attention", r"nvjet_sm90_tst_128x64")]

    try:
        reset_registry([Plugin()])
        assert categories(["mylib_fused_thing", "nvjet_sm90_tst_128x64_64x8_1x2_h_bz_NTT", "nvjet_sm90_x"]) == \
            ["my-library", "attention", "gemm"]
    finally:
        reset_registry()


JAX_FILES = sorted(p for p in (REPO / "fixtures" / "jax").glob("*/plugins/profile/*/perfetto_trace.json.gz")
                   if p.parts[-5] != "jax_cpu_mlp")  # XLA's CPU backend: no GPU kernel


@pytest.mark.parametrize("path", JAX_FILES, ids=lambda p: p.parts[-5])
def test_xla_kernels_leave_only_unnamed_fusions_in_other(path):
    """On the JAX captures every kernel gets a category but XLA's fusions named only ``fusion_N``; on the GPT step
    those are 19.8% of the kernel time (docs/rules.md). Kernels: the complete events on ``Stream #`` threads of
    ``/device:GPU:`` processes, from the raw JSON."""
    doc = json.loads(gzip.decompress(path.read_bytes()), parse_float=Decimal)
    events = doc["traceEvents"]
    gpu = {e["pid"] for e in events if e.get("ph") == "M" and e["name"] == "process_name"
           and e["args"]["name"].startswith("/device:GPU:")}
    streams = {(e["pid"], e["tid"]) for e in events if e.get("ph") == "M" and e["name"] == "thread_name"
               and e["args"]["name"].startswith("Stream #") and e["pid"] in gpu}
    times: dict[str, int] = {}
    for e in events:
        args = e.get("args", {})
        if e.get("ph") == "X" and (e["pid"], e["tid"]) in streams and not e["name"].startswith(("Memcpy", "Memset")):
            times[e["name"]] = times.get(e["name"], 0) + us_to_ns(e["dur"])
    names = sorted(times)
    other = {n for n, c in zip(names, categories(names)) if c == "other"}
    assert other == {n for n in names if re.fullmatch(r"fusion_\d+", n)}
    share = round(100 * sum(times[n] for n in other) / sum(times.values()), 1)
    assert share == {"jax_gpt": 19.8, "jax_mlp": 2.1, "jax_convnet": 0.3, "jax_dp_gpt": 10.4}[path.parts[-5]]


def _chain(names: list, table, default, lowercase: bool = False) -> list:
    """The oracle: the table as a plain when/then chain run on every row (what first_match was before it
    classified each distinct name once), with Python's ``re`` (these tables' patterns mean the same there)."""
    out = []
    for name in names:
        subject = None if name is None else (name.lower() if lowercase else name)
        out.append(next((label for label, pattern in table
                         if subject is not None and re.search(pattern, subject)), default))
    return out


@pytest.mark.parametrize("size", [5, 500])
def test_first_match_is_the_row_by_row_chain(size):
    """first_match gives, name by name, the first matching row's label (``default`` for none and for null), for
    a few names (no query) and many (distinct names joined back), repeated names and nulls included; and the
    chain runs once per distinct name per process: asking again runs no polars query."""
    names = [n for ns in NAMES.values() for n in ns] + ["cudaLaunchKernel", "cudaFree", "unknown", None]
    names = (names * (size // len(names) + 1))[:size] if size > len(names) else names[:size - 1] + [None]
    for table, default, lower in ((expr.API_CLASSES, expr.OTHER_CLASS, False),
                                  (expr.KERNEL_CATEGORIES, expr.OTHER_CATEGORY, True),
                                  (expr.COLLECTIVES, "", True)):
        got = pl.select(expr.first_match(pl.lit(pl.Series(names, dtype=pl.String)), table, default,
                                         lowercase=lower)).to_series().to_list()
        assert got == _chain(names, table, default, lower)
    first = pl.select(expr.api_class(pl.lit(pl.Series(names, dtype=pl.String)))).to_series().to_list()
    assert first == _chain(names, expr.API_CLASSES, expr.OTHER_CLASS)  # api_class: a null name is "other"
    classifier = expr._classifier(expr.API_CLASSES, expr.OTHER_CLASS, "name")
    calls = []
    real = classifier.classify
    classifier.classify = lambda series: calls.append(series.len()) or real(series)
    try:
        again = pl.select(expr.api_class(pl.lit(pl.Series(names, dtype=pl.String)))).to_series().to_list()
    finally:
        del classifier.classify
    assert calls == [] and again == _chain(names, expr.API_CLASSES, expr.OTHER_CLASS)


def test_collective_and_family_of_distinct_names():
    """collective, communication_family and normalize_collective, classified once per distinct name, agree with
    their tables applied row by row (the rule of :func:`traceparse.expr.collective`: a communication name's
    collective where the key says one, "unknown" for a kernel that does not, else null)."""
    names = ["ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)",
             "ncclDevKernel_Generic(ncclDevKernelArgsStorage<4096ul>)", "c10d::broadcast_", "c10d::wait",
             "gloo:all_reduce", "record_param_comms", "reduce_kernel", "volta_sgemm", "", None] * 10
    family = _chain(names, expr.COMMUNICATION_NAMES, None, lowercase=True)
    key = [None if n is None else re.sub(r"[^a-z0-9]", "", re.sub(r"\(.*$", "", n.lower().replace(
        "(anonymous namespace)", ""))) for n in names]
    said = _chain(key, expr.COLLECTIVES, None)
    want = [None if f is None else s if s else ("unknown" if f in ("nccl kernel", "msccl kernel") else None)
            for f, s in zip(family, said)]
    series = pl.lit(pl.Series(names, dtype=pl.String))
    assert pl.select(expr.communication_family(series)).to_series().to_list() == family
    assert pl.select(expr.collective(series)).to_series().to_list() == want
    assert want[:6] == ["all_reduce", "unknown", "broadcast", None, "all_reduce", None]
    assert pl.select(expr.normalize_collective(series)).to_series().to_list() == said


def test_kernel_share_names_the_uncategorised_as_such(tmp_path):
    """Kernels of no known category led: "the top kernel takes 71.5%; other kernels take 100.0%" read as the rest
    of the kernels taking all of it (nvprof and ncu files of small CUDA programs)."""
    import json as _json
    from helpers import run_cli

    events = [{"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": 7, "ts": ts, "dur": dur,
               "args": {"device": 0, "stream": 7, "correlation": ts}}
              for name, ts, dur in (("compute_flux", 0, 75), ("time_step", 100, 25))]
    path = tmp_path / "k.json"
    path.write_text(_json.dumps({"schemaVersion": 1, "traceEvents": events}))
    code, out, err = run_cli("--store", str(tmp_path / "s"), "analyze", "--json", "--rule", "kernel-share", str(path))
    assert code == 0, err
    (share,) = _json.loads(out)["findings"]
    assert share["message"].endswith("the top kernel takes 75.0%; kernels of no known category take 100.0%.")


def _overlap_finding(tmp_path, kernels: list[tuple[str, int, int, int]]) -> dict:
    """comm-compute-overlap's finding on a hand-written trace of ``(name, ts_us, dur_us, stream)`` kernels."""
    import json as _json
    from helpers import run_cli

    events = [{"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": stream, "ts": ts, "dur": dur,
               "args": {"device": 0, "stream": stream, "correlation": ts}} for name, ts, dur, stream in kernels]
    path = tmp_path / "kernels.json"
    path.write_text(_json.dumps({"schemaVersion": 1, "traceEvents": events}))
    code, out, err = run_cli("--store", str(tmp_path / "s"), "analyze", "--json", "--rule", "comm-compute-overlap",
                             str(path))
    assert code == 0, err
    (found,) = _json.loads(out)["findings"]
    return found


def test_collectives_written_as_their_own_kernels_are_communication(tmp_path):
    """PyTorch's symmetric-memory all-reduce was "reduction/softmax" and no communication: on a B200 vLLM trace
    (TraceLens' tests/traces/b200) comm-compute-overlap said nothing of 74 all-reduce kernels, 2.142 ms exposed.
    Each such kernel now has its collective; a hand-written trace of one exposed and one hidden all-reduce beside
    a GEMM gives the exposed time to the nanosecond."""
    names = NAMES["communication"][:4]  # the direct-collective names added with the B200 trace
    got = pl.select(expr.collective(pl.lit(pl.Series(names)))).to_series().to_list()
    assert got == ["all_reduce", "all_reduce", "all_reduce", "all_reduce"]
    gather = "void c10d::symmetric_memory::multimem_all_gather_kernel<16>(char*, char*, unsigned long, unsigned int**, unsigned long, unsigned long)"
    assert pl.select(expr.collective(pl.lit(pl.Series([gather])))).item() == "all_gather"

    gemm = "nvjet_tst_64x64_64x16_2x1_2cta_v_bz_bias_TNT"
    found = _overlap_finding(tmp_path, [(gemm, 0, 100, 7), (names[0], 100, 30, 7),      # exposed: nothing beside it
                                        (gemm, 200, 100, 7), (names[0], 220, 30, 20)])  # hidden under the GEMM
    assert found["metrics"]["comm_time_ns"] == 60_000 and found["metrics"]["overlapped_ns"] == 30_000


def test_two_collectives_at_once_are_exposed_once(tmp_path):
    """Hand-written after HTA's negative-queue-length trace (an A100, rank 0 of 16): two SendRecv kernels in flight
    at once on two streams, no compute beside them. The per-device row said exposed 187.8 ms, each kernel's
    exposed time summed, where the timeline has 185.3 ms; exposed is now the time on the timeline, as the time at
    stake is: here 100 + 40 - 20 = 120 us (the two overlap for 20 us), with 140 us of communication time."""
    send = "ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)"
    gemm = "nvjet_tst_64x64_64x16_2x1_2cta_v_bz_bias_TNT"
    found = _overlap_finding(tmp_path, [(gemm, 0, 10, 7), (send, 20, 100, 20), (send, 100, 40, 24), (gemm, 200, 10, 7)])
    (item,) = found["items"]
    assert item["comm_time_ns"] == 140_000 and item["overlapped_ns"] == 0 and item["exposed_ns"] == 120_000
    assert found["impact_ns"] == 120_000
