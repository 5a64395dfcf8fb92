"""Shared polars expressions and small helpers over the event table, for measures, rules and commands.

A trace can hold timed events (``start_ns`` set, ``calls`` 1) and aggregated
rows (``start_ns`` null, ``duration_ns`` the total of ``calls`` calls,
``bytes`` the total bytes) of the same kind, e.g. an nvprof log with both a
GPU trace and a summary, or nsys trace and summary reports of one capture
ingested together. Both then describe the same calls, so a figure counts one
of them: the timed events, which are the more detailed (:func:`prefer_timed`).

Every function here returns a ``pl.Expr`` (or works on one frame) so that a
plugin composes them with its own; none knows any rule.

>>> import polars as pl
>>> df = pl.DataFrame({"kind": ["kernel", "api"], "start_ns": [10, None], "duration_ns": [5, 7]})
>>> df.filter(kind_is("kernel") & timed()).select(end_ns())["end_ns"].to_list()
[15]
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import polars as pl

#: Copy directions that cross the host link (PCIe, or NVLink-C2C on Grace systems).
HOST_DEVICE = ("HtoD", "DtoH")
#: Event kinds that are work on a device.
GPU_KINDS = ("kernel", "memcpy", "memset")

# -- kernel categories ---------------------------------------------------------
#: XLA's collective operations by their HLO names (``all-reduce-start.1``, ``all-gather-done``,
#: ``reduce-scatter.3``, ``collective-permute``, ``all-to-all``; ``_`` as well as ``-``): a kernel or XLA op
#: named so is communication (:data:`KERNEL_CATEGORIES`, :data:`COMMUNICATION_NAMES`).
XLA_COLLECTIVE = (r"^(all[-_]reduce|all[-_]gather|reduce[-_]scatter|all[-_]to[-_]all|ragged[-_]all[-_]to[-_]all"
                  r"|collective[-_]permute|collective[-_]broadcast)([-_.]|$)")
#: Collectives written as kernels of their own, outside NCCL: PyTorch's symmetric memory
#: (``multimem_all_reduce_kernel``, ``one_shot_all_reduce_kernel``, ``two_shot_all_reduce_kernel``,
#: ``multimem_all_gather_kernel``), vLLM's custom all-reduce (``cross_device_reduce_1stage``) and TensorRT-LLM's
#: (``allreduce_fusion_kernel``, ``oneShotAllReduceKernel``, ``twoShotAllReduceKernel``).
DIRECT_COLLECTIVE = (r"multimem_(one_shot_)?all_?(reduce|gather)|(one|two)_?shot_?all_?reduce"
                     r"|cross_device_reduce_[12]stage|allreduce_fusion_kernel")
#: What a kernel does, from its name: (category, regular expression searched in the lower-cased name). The
#: first row that matches wins, so the order matters (a cuDNN flash-attention kernel's name also says
#: "wgmma" and "fprop", a copy kernel's "elementwise_kernel"). Plugins put rows of their own in front of
#: these with the hook ``traceparse_kernel_categories`` (see :func:`kernel_categories`). docs/rules.md
#: (kernel-share) defines each category; tests/test_kernel_categories.py holds real names for every row.
KERNEL_CATEGORIES: list[tuple[str, str]] = [
    # NCCL / RCCL (ncclKernel_*, ncclDevKernel_*, RCCL's ncclDevKernel_Generic), MSCCL; XLA's collectives by
    # their HLO names (all-reduce-start.1, all-gather-done, reduce-scatter.3, collective-permute, all-to-all)
    ("communication", r"nccl|rccl|msccl|" + DIRECT_COLLECTIVE + "|" + XLA_COLLECTIVE),
    # torch.compile (Inductor) names its Triton kernels triton_<kind>_fused_<the aten ops fused>: kind poi
    # (pointwise), red (reduction), per (persistent reduction), for (foreach), tem (template: mm, conv,
    # flex attention). A template is what it computes. A pointwise or reduction kernel takes the category of
    # the op family its name mentions (norm, softmax/loss, pooling, embedding), else triton-fused; it is never
    # a GEMM or a convolution ("convolution_backward" in a pointwise kernel's name is the bias gradient).
    ("attention", r"^triton_tem_.*(attention|sdpa|attn)"),
    ("convolution", r"^triton_tem_.*conv"),
    ("gemm", r"^triton_tem_.*(mm|matmul|gemm)"),
    ("normalization", r"^triton_(poi|red|per)_.*(batch_norm|layer_norm|group_norm|instance_norm|rms_norm|_norm_)"),
    ("reduction/softmax", r"^triton_(poi|red|per)_.*(softmax|nll_loss|cross_entropy)"),
    ("pooling", r"^triton_(poi|red|per)_.*pool"),
    ("embedding", r"^triton_(poi|red|per)_.*embedding"),
    # XLA's Triton fusions: softmax (triton_softmax_31) and, in older XLA, GEMMs (triton_gemm_dot_2)
    ("reduction/softmax", r"^triton_softmax"),
    ("gemm", r"^triton_gemm"),
    ("triton-fused", r"^triton_"),
    # flash / memory-efficient attention, cuDNN SDPA (and its dO·O and dQ helper kernels), CK / aiter fmha,
    # Triton attn_fwd / _attn_bwd
    ("attention", r"flash([^i]|$)|fmha|sdpa|attention|attn_(fwd|bwd)|_attn|mha_(fwd|bwd)|batch(prefill|decode)with"
                  r"|cudnn::fusion::compute_dot_do_o"
                  r"|cudnn::fusion::convert_dq"),
    # batch / layer / group / instance / RMS norm and their backward kernels (cuDNN bn_fw/bn_bw, torch's
    # GammaBetaBackward and layer_norm_grad_input, MIOpen MIOpenBatchNorm*)
    ("normalization", r"batch_?norm|layer_?norm|group_?norm|instance_?norm|rms_?norm|\bbn_(fw|bw)|::bn_|welford"
                      r"|gammabetabackward|norm_grad"),
    # (FBGEMM's permute_pooled_embs is a permute of pooled embeddings: layout/copy, below)
    ("pooling", r"pool([^e]|$)|adaptive_?av(era)?g"),
    # cuDNN implicit-GEMM / xmma / cutlass convolutions (fprop, dgrad, wgrad), winograd, MIOpen igemm and
    # naive conv, Composable Kernel grouped conv; cuDNN 7's Maxwell-to-Turing convolutions by precision
    # (volta_scudnn_128x64_relu_interior_nn_v1: its "relu" is a fused epilogue, volta_h884cudnn_256x64_...)
    ("convolution", r"conv(olu|olv|_|[1-3]d|uni)|implicit_?gemm|\bigemm|_igemm|dgrad|wgrad|fprop|winograd"
                    r"|_bwd_weight|_[shi]?[0-9]{0,4}cudnn_|fft[12]d_(r2c|c2r)_"),
    # cuBLAS's level-1 kernels, by their parameter types (copy_kernel<double>(cublasCopyParams<T1>)): no GEMM
    ("layout/copy", r"cublas(copy|swap)params"),
    ("elementwise", r"cublas(axpy|scal|rot|rotm)params"),
    ("reduction/softmax", r"cublas(dot|nrm2|asum|iamax|iamin|amax|amin)params"),
    # cuBLAS (Hopper nvjet_* too), cuBLASLt split-K, cutlass / xmma GEMMs, rocBLAS / hipBLASLt Tensile Cijk_*,
    # CK gemm, tensor-core tile names; not the "gemm" of FBGEMM's namespace (fbgemm_gpu::), which names its
    # embedding, permute and FP8 kernels and turns up in the template arguments of others
    ("gemm", r"nvjet|(^|[^b]|[^f]b)gemm|gemv|cublas|matmul|splitkreduce|reducesplitk|^cijk_|cutlass|xmma|wgmma|hmma"
             r"|s1688|h1688|s884|h884|s16816|h16816|_bmm|addmm|^bmm_|wmma"),
    # fused multi-tensor optimizer steps (torch foreach / fused Adam, SGD's foreach add), apex
    ("optimizer", r"multi_tensor_apply|fused_?adam|adamw?_|fused_sgd|lamb_"),
    # embedding lookups and their backward (index sort, segment sums); FBGEMM's table-batched embeddings
    # (split_embedding_*, and the index checks and linearization before them)
    ("embedding", r"embedding|index_?select|gather_kernel|sum_and_scatter|compute_grad_weight|partial_?segment"
                  r"|partials_per_segment|bounds_check_indices|linearize_index"),
    # cuDNN's RNN cells (elemWiseRNNcell: an LSTM or GRU step's gates) and their backward (LSTM_elementWise_bp1,
    # GRU_elementWise_bp2): the second part's signature holds cudnn::reduced_divisor, a fast division, no reduction
    ("elementwise", r"elemwisernncell|_elementwise_bp\d"),
    # reductions, softmax, losses, and the scans and sorts of cub
    # (and cub's merge sorts and torch's tensor_kernel_scan_* of sort and cumsum, sparse tensors' coalesceValuesKernel
    # summing the values of repeated indices: a sparse embedding gradient before its optimizer step)
    ("reduction/softmax", r"reduce|reduction|softmax|nll_loss|cross_entropy|argmax|argmin|topk|cumsum"
                          r"|scan_?kernel|devicescan|radix_?sort|segmented_?sort|unique_?by_?key|devicecompact"
                          r"|histogram|merge_?sort|kernel_scan_|coalescevalues"),
    # memory-format conversions (cuDNN nchwToNhwc, MIOpen transposes), transposes, copies and casts (torch's
    # direct_copy_kernel_cuda, dtype copies), concatenation, padding, the HIP runtime's copy kernels
    # XLA: concatenations (input_concatenate_fusion), slices and copies wrapped as fusions, dynamic (update)
    # slices, MIOpen's 3-D im2col of XLA's convolutions (Im3d2Col), XLA's device copy kernels in command buffers
    # (memcpy128, memcpy32_post: a data-parallel program's buffers)
    ("layout/copy", r"nchwtonhwc|nhwctonchw|nchw2|nhwc2|transpose|copy_kernel|catarray|batchedcopy|converttensor"
                    r"|add_?padding|remove_?padding|im2col|col2im|im3d2col|permute|rocclr_copy|copybuffer|concatenate"
                    r"|^wrapped_(slice|copy|pad|reverse)|dynamic_(update_)?slice|^memcpy\d"),
    # (cub's transform kernels: thrust::transform, thrust::sequence)
    ("elementwise", r"elementwise|vectorized|unrolled|pointwise|fill|threshold|relu|sigmoid|tanh|gelu|silu"
                    r"|dropout|clamp|scale|add_kernel|mul_kernel|cast|philox|random|distribution|bernoulli"
                    r"|cub::detail::transform::"
                    # FBGEMM's FP8 (de)quantization
                    r"|quantize|fp8rowwise_to|fp8_qparam"
                    r"|triu_tril|tensorop|index_put|scatter|where_kernel|masked|^memset"
                    # XLA's loop fusions (loop_add_fusion, loop_convert_tanh_fusion) and single elementwise ops
                    # wrapped as fusions (wrapped_convert, wrapped_broadcast); their reductions, transposes and
                    # copies took the rows above
                    r"|^loop_\w*fusion|^wrapped_"),
]

#: The category of a kernel name no pattern of :data:`KERNEL_CATEGORIES` matches.
OTHER_CATEGORY = "other"
#: Every built-in kernel category once, in the table's order of first appearance, then :data:`OTHER_CATEGORY`.
KERNEL_CATEGORY_NAMES = tuple(dict.fromkeys(c for c, _ in KERNEL_CATEGORIES)) + (OTHER_CATEGORY,)


def kernel_categories(reg=None) -> list[tuple[str, str]]:
    """The kernel-category table in force: the rows plugins give (hook ``traceparse_kernel_categories``), then
    :data:`KERNEL_CATEGORIES`.

    A plugin's rows come first, so they win over the built-in ones for the names they match (an in-house
    library's kernels, a finer split of a category).
    """
    from traceparse.plugins import registry

    return list((reg or registry()).kernel_categories) + KERNEL_CATEGORIES


#: (class, regular expression matched at the start of a CUDA or HIP API name); the first match wins.
API_CLASSES: list[tuple[str, str]] = [
    # one call that replays a whole captured graph of kernels and copies (CUDA graphs, HIP graphs): its
    # GPU work shares the call's correlation id (:data:`traceparse.measures.launches`)
    ("graph_launch", r"^(cudaGraphLaunch|cuGraphLaunch|hipGraphLaunch)"),
    # kernel launches, including CUDA < 9's cudaConfigureCall/cudaSetupArgument/cudaLaunch sequence, and HIP's
    # hipLaunchKernel / hipExtLaunchKernel / hipModuleLaunchKernel / hipExtModuleLaunchKernel ...
    ("launch", r"^(cudaLaunch|cuLaunch|cudaConfigureCall|cudaSetupArgument"
               r"|__cudaPushCallConfiguration|__cudaPopCallConfiguration"
               r"|hip\w*Launch|__hipPushCallConfiguration|__hipPopCallConfiguration)"),
    # data movement: copies and managed-memory prefetch
    ("memcpy", r"^(cudaMemcpy|cuMemcpy|cudaMemPrefetchAsync|cuMemPrefetchAsync|hipMemcpy|hipMemPrefetchAsync)"),
    # a device buffer filled with one value (zeroing gradients, buffers): GPU work, but no copy
    ("memset", r"^(cudaMemset|cuMemset|hipMemset)"),
    # the host waits for the GPU
    ("synchronize", r"^(cudaDeviceSynchronize|cudaThreadSynchronize|cudaStreamSynchronize|cudaEventSynchronize"
                    r"|cudaStreamWaitEvent|cuCtxSynchronize|cuStreamSynchronize|cuEventSynchronize"
                    r"|cuStreamWaitEvent|hip\w*Synchronize|hipStreamWaitEvent)"),
    # device, host (pinned) and managed memory allocation and release
    ("allocation", r"^(cudaMalloc|cudaFree|cudaHostAlloc|cudaHostRegister|cudaHostUnregister|cudaMemPool"
                   r"|cuMemAlloc|cuMemFree|cuMemHostAlloc|cuMemHostRegister|cuMemHostUnregister|cuMemCreate"
                   r"|cuMemRelease|cuMemMap|cuMemUnmap|cuMemAddressReserve|cuMemAddressFree|cuMemPool"
                   r"|hipMalloc|hipExtMalloc|hipFree|hipHostMalloc|hipHostAlloc|hipHostFree|hipHostRegister"
                   r"|hipHostUnregister|hipMemPool)"),
]
#: The class of an API name no pattern of :data:`API_CLASSES` matches.
OTHER_CLASS = "other"
#: Every API class, in the table's order, then :data:`OTHER_CLASS`.
API_CLASS_NAMES = tuple(c for c, _ in API_CLASSES) + (OTHER_CLASS,)


def timed() -> pl.Expr:
    """True for rows placed in time (``start_ns`` set); aggregated rows have no start.

    >>> pl.DataFrame({"start_ns": [1, None]}).select(timed())["start_ns"].to_list()
    [True, False]
    """
    return pl.col("start_ns").is_not_null()


def end_ns() -> pl.Expr:
    """``start_ns + duration_ns``, named ``end_ns``: the (exclusive) end of a half-open interval."""
    return (pl.col("start_ns") + pl.col("duration_ns")).alias("end_ns")


def kind_is(*kinds: str) -> pl.Expr:
    """True for rows whose ``kind`` is one of ``kinds`` (works on the Enum column and on plain text).

    >>> pl.DataFrame({"kind": ["kernel", "api"]}).select(kind_is("kernel", "memcpy"))["kind"].to_list()
    [True, False]
    """
    return pl.col("kind").is_in(list(kinds))


def calls() -> pl.Expr:
    """``calls`` with a missing count read as 1: one row is one call unless it says otherwise."""
    return pl.col("calls").fill_null(1)


def is_copy_kind(kinds: Iterable[str]) -> pl.Expr:
    """True for rows whose ``copy_kind`` is one of ``kinds`` (false when the direction is unknown)."""
    return pl.col("copy_kind").cast(pl.String).is_in(list(kinds)).fill_null(False)


def first_match(names: pl.Expr, table: list[tuple[str, str]], default: str, *, lowercase: bool = False) -> pl.Expr:
    """For each name, the label of the first ``(label, regex)`` row of ``table`` that matches it, else ``default``.

    Classifications (kernel categories, API classes) stay a readable table
    instead of a chain of conditions; ``lowercase`` matches the lower-cased name.
    A null name gets ``default``.

    The chain of conditions is built once per table (:class:`_Classifier`) and run only on names it has not
    seen in this process: a trace repeats a few hundred names, and a run of a thousand small ranks the same
    few names a thousand times (4 ms a call when the chain was built and run each time).

    >>> names = pl.Series(["cudaLaunchKernel", "cudaFree", "cuInit"])
    >>> pl.select(first_match(pl.lit(names), API_CLASSES, "other")).to_series().to_list()
    ['launch', 'allocation', 'other']
    """
    classify = _classifier(table, default, "lowercase" if lowercase else "name")
    return names.map_batches(classify, return_dtype=pl.String, is_elementwise=True)


#: What a :class:`_Classifier` matches its table against, made from each distinct name.
_SUBJECTS = {
    "name": lambda: pl.col("name"),
    "lowercase": lambda: pl.col("name").str.to_lowercase(),
    # a name lower-cased, without its parameter list (a C++ "(anonymous namespace)" is no parameter list),
    # letters and digits only (:data:`COLLECTIVES`' subject)
    "collective key": lambda: pl.col("name").str.to_lowercase().str.replace_all(r"\(anonymous namespace\)", "")
    .str.replace(r"\(.*$", "")
    .str.replace_all(r"[^a-z0-9]", ""),
}


class _Classifier:
    """A ``(label, regex)`` table as one polars condition chain, with the label of every name it classified.

    Called on a String Series, it gives each value's label (``default`` for a null, like a name no row
    matches): the chain runs on the distinct values not classified before, in one query, and the answers are
    kept (at most :data:`MEMO_NAMES`; then the memory starts over). The regular expressions are polars' own,
    so the labels are those the chain gives row by row. ``subject`` (:data:`_SUBJECTS`) is what is matched.
    """

    MEMO_NAMES = 50_000

    def __init__(self, table: tuple[tuple[str, str], ...], default: str | None, subject: str = "name"):
        text = pl.col("subject")
        chain = pl.lit(default, dtype=pl.String)
        for label, pattern in reversed(table):
            chain = pl.when(text.str.contains(pattern)).then(pl.lit(label)).otherwise(chain)
        self.subject, self.chain = _SUBJECTS[subject]().alias("subject"), chain.alias("label")
        self.default, self.memo = default, {}

    def labels(self, values: list) -> list:
        """The label of each of ``values`` (distinct, no null), classifying only the new ones."""
        memo = self.memo
        new = [v for v in values if v not in memo]
        if new:
            if len(memo) + len(new) > self.MEMO_NAMES:
                memo.clear()
            found = self.classify(pl.Series(new, dtype=pl.String))
            memo.update(zip(new, found))
        return [memo[v] for v in values]

    def classify(self, names: pl.Series) -> list:
        """The labels of ``names`` (distinct, not null), worked out now."""
        frame = names.to_frame("name").lazy()
        return frame.select(self.subject).select(self.chain).collect()["label"].to_list()

    def __call__(self, names: pl.Series) -> pl.Series:
        names = names.cast(pl.String)
        if names.len() <= 64:  # a small rank's few names: no query at all once they are known
            values = names.to_list()
            distinct = list(dict.fromkeys(v for v in values if v is not None))
            label = dict(zip(distinct, self.labels(distinct)))
            return pl.Series(names.name, [self.default if v is None else label[v] for v in values],
                             dtype=pl.String)
        distinct = names.drop_nulls().unique()
        found = pl.Series(self.labels(distinct.to_list()), dtype=pl.String)
        out = names.replace_strict(distinct, found, default=None, return_dtype=pl.String)
        return out if self.default is None else out.fill_null(self.default)


_CLASSIFIERS: dict[tuple, _Classifier] = {}


def _classifier(table: Iterable[tuple[str, str]], default: str | None, subject: str = "name") -> _Classifier:
    """The :class:`_Classifier` of ``table``, ``default`` and ``subject``, built on first use (tables are
    compared by content: a plugin's kernel categories added later make a new one)."""
    rows = tuple((str(label), str(pattern)) for label, pattern in table)
    key = (rows, default, subject)
    found = _CLASSIFIERS.get(key)
    if found is None:
        found = _CLASSIFIERS[key] = _Classifier(rows, default, subject)
    return found


def kernel_category(names: pl.Expr, table: list[tuple[str, str]] | None = None) -> pl.Expr:
    """The category of each kernel name, case-insensitive: by :func:`kernel_categories` (plugins' rows, then
    :data:`KERNEL_CATEGORIES`), or by ``table`` when given.

    >>> names = pl.Series(["nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT", "triton_poi_fused_add_1", "foo"])
    >>> pl.select(kernel_category(pl.lit(names))).to_series().to_list()
    ['gemm', 'triton-fused', 'other']
    """
    return first_match(names, kernel_categories() if table is None else table, OTHER_CATEGORY, lowercase=True)


def api_class(names: pl.Expr) -> pl.Expr:
    """The class of each CUDA API name (:data:`API_CLASSES`); a null name is "other"."""
    return first_match(names.fill_null(""), API_CLASSES, OTHER_CLASS)


def sort_rows(frame: pl.DataFrame, by: list[str], descending: bool | list[bool] = False,
              nulls_last: bool = False, lexsort: bool = False) -> pl.DataFrame:
    """``frame.sort(by, ...)`` with the columns of ``by`` that hold one value on every row left out of the sort.

    The rows of one trace share their ``trace_id`` (and often their device): sorting by that text column
    too costs ten times a sort by the numbers after it (87,000 interval edges: 18 ms against 1.5 ms), and
    changes nothing. For a sort whose full key has no ties (or whose result does not depend on their order).
    With ``lexsort`` integer and boolean keys are sorted by numpy (:func:`sort_order`): faster on rows far
    from their order (a critical path's edges: 0.37 → 0.24 s), slower on rows nearly in order already (events
    by start: polars sees the order), so a caller asks for it where it measured it.
    """
    by = list(by)
    desc = [descending] * len(by) if isinstance(descending, bool) else list(descending)
    keep = [i for i, c in enumerate(by) if not is_constant(frame[c])]
    if not keep:
        return frame
    by, desc = [by[i] for i in keep], [desc[i] for i in keep]
    order = sort_order(frame, by, desc, nulls_last) if lexsort else None
    if order is not None:
        return frame[order]
    return frame.sort(by, descending=desc, nulls_last=nulls_last)


def by_id(frame: pl.DataFrame, column: str = "event_id") -> pl.DataFrame:
    """``frame.sort(column)``, or ``frame`` itself where that column strictly increases already (no null, no tie:
    the same rows in the same order a sort gives): rows taken from a stored table come in event-id order, and a
    sort of them to keep the first of each key (``unique(keep="first")``, ``group_by().first()``) only checked it."""
    values = frame[column]
    if values.null_count() == 0 and (frame.height < 2 or bool((values.diff().slice(1) > 0).all())):
        return frame
    return frame.sort(column)


#: Fewer rows than this are sorted by polars itself (numpy's set-up costs more than it saves).
LEXSORT_ROWS = 10_000


def sort_order(frame: pl.DataFrame, by: list[str], descending: list[bool], nulls_last: bool = False):
    """The row order of ``frame.sort(by, descending=descending, nulls_last=nulls_last)`` as a numpy array, from
    numpy's stable ``lexsort`` of the key columns, when every key is an integer or boolean column and the frame
    has at least :data:`LEXSORT_ROWS` rows; else None (let polars sort).

    polars' sort by several columns encodes each row's keys first: on 500,000 rows of a critical path's host
    points, eight integer keys took 137 ms of CPU against 47 ms for ``lexsort`` and the gather. A null sorts as
    polars puts it (first, or last with ``nulls_last``); ties keep their order (polars' order of ties is not
    promised, so a caller may not depend on it either way).
    """
    if frame.height < LEXSORT_ROWS:
        return None
    import numpy as np

    keys = []  # least significant first (np.lexsort's order): from the last column of ``by`` to the first
    for column, down in zip(reversed(by), reversed(descending)):
        values = frame[column]
        if not (values.dtype.is_integer() or values.dtype == pl.Boolean):
            return None
        nulls = values.null_count()
        raw = values.fill_null(0).to_numpy() if nulls else values.to_numpy()
        if raw.dtype == np.bool_:
            raw = raw.astype(np.uint8)
        keys.append(~raw if down else raw)  # bitwise not: the order reversed, with no overflow
        if nulls:
            missing = values.is_null().to_numpy()
            keys.append(missing if nulls_last else ~missing)  # where the nulls go goes before the values
    return np.lexsort(_packed(keys))


def _packed(keys: list) -> list:
    """``keys`` (numpy integer arrays, least significant first) with neighbours whose ranges multiply to less
    than 2^62 packed into one int64 key each: the same order, in fewer passes of ``lexsort`` (a critical path's
    host points: time, depth, kind of point and node in one key)."""
    import numpy as np

    out, acc, span = [], None, 1
    for key in keys:
        low, high = int(key.min()), int(key.max())
        width = high - low + 1
        if width >= 2 ** 62:  # too wide to offset in int64: a key of its own
            out += [k for k in (acc, key) if k is not None]
            acc, span = None, 1
            continue
        # offset from its least value (an unsigned key in its own type, whose values may not fit int64)
        offset = (key - key.dtype.type(low)).astype(np.int64) if key.dtype.kind == "u" else key.astype(np.int64) - low
        if acc is not None and span * width < 2 ** 62:
            acc, span = acc + offset * span, span * width
        else:
            if acc is not None:
                out.append(acc)
            acc, span = offset, width
    if acc is not None:
        out.append(acc)
    return out


def is_constant(column: pl.Series) -> bool:
    """True when every value of ``column`` is the same (all null counts as the same): a key a sort, a group or a
    window needs no more (:func:`sort_rows`)."""
    nulls = column.null_count()
    if nulls == column.len():
        return True
    if nulls or column.dtype.is_nested():
        return False
    return column.min() == column.max() if column.dtype.is_numeric() or column.dtype == pl.String \
        else column.n_unique() == 1


def join_rows(left: pl.DataFrame, right: pl.DataFrame, on: list[str], how: str = "left", **options) -> pl.DataFrame:
    """``left.join(right, on=on, how=how, **options)`` (``how`` left, inner, semi or anti) with the keys that hold
    one and the same value, not null, on every row of both frames left out of the join: the rows of one trace
    share their ``trace_id``, and a join on the event id alone takes half the time of one on both."""
    on = list(on)
    same = [c for c in on if _one_value(left[c]) is not None and _one_value(left[c]) == _one_value(right[c])]
    if not same or len(same) == len(on) or how not in ("left", "inner", "semi", "anti"):
        return left.join(right, on=on, how=how, **options)
    return left.join(right.drop(same), on=[c for c in on if c not in same], how=how, **options)


def _one_value(column: pl.Series):
    """The value every row of ``column`` holds, or None (none, several, or a null)."""
    if column.len() == 0 or column.null_count() or column.dtype.is_nested() or not is_constant(column):
        return None
    return column[0]


def prefer_timed(rows: pl.DataFrame) -> tuple[pl.DataFrame, int]:
    """``rows`` without its aggregated rows when it also has timed ones, and how many were dropped.

    Call it on the rows of one kind: when timed events of that kind exist,
    the aggregated rows summarize the same calls and would count them twice.
    A table of only aggregated (or only timed) rows is returned unchanged.
    """
    n_timed = int(rows.select(timed().sum()).item() or 0)
    if n_timed == 0 or n_timed == rows.height:
        return rows, 0
    return rows.filter(timed()), rows.height - n_timed


def flat_rows(rows: pl.DataFrame) -> tuple[pl.DataFrame, int]:
    """``rows`` without call-path rows (``call_path`` with `` => ``) when the flat rows are there too; and how many.

    A profile with call paths (TAU) holds each routine flat and once per call
    path; counting both would count its time twice.
    """
    if "call_path" not in rows.columns:
        return rows, 0
    nested = pl.col("call_path").fill_null("").str.contains(" => ", literal=True)
    n_nested = int(rows.select(nested.sum()).item() or 0)
    if n_nested == 0 or n_nested == rows.height:
        return rows, 0
    return rows.filter(~nested), n_nested


def as_shown(column: str) -> pl.Expr:
    """``column`` rounded to the significant figures the screen shows: a sort key under which rows that read
    alike (a run's ranks, idle to the microsecond but for a few nanoseconds) tie, so that the next key (the
    rank) orders them, not nanoseconds no one sees."""
    from traceparse.figures import digits

    return pl.col(column).cast(pl.Float64).round_sig_figs(digits())


def lane_label(names: dict | None = None, otherwise: str | None = "-") -> pl.Expr:
    """A critical-path segment's lane from its ``tid`` and ``stream_id``: ``thread 522 (pt_autograd_0)`` (the name
    where the trace names that thread: :func:`traceparse.threads.thread_names`), ``thread tf_pjrt_thread_pool/-78…``
    where the name carries the id (XLA's host lines), ``stream 7``, else ``otherwise``. One text for the same lane in
    ``analyze``, ``whatif``, the HTML page and the Perfetto export."""
    by_tid: dict[int, set[str]] = {}
    for (pid, tid), name in (names or {}).items():
        if pid is not None:  # a process's thread, not a device's line
            by_tid.setdefault(tid, set()).add(name)
    labels = {tid: f"thread {name}" if name.endswith(f"/{tid}") else f"thread {tid} ({name})"
              for tid, (name, *more) in ((t, sorted(n)) for t, n in by_tid.items()) if not more}
    thread = pl.format("thread {}", pl.col("tid"))
    if labels:
        thread = pl.col("tid").replace_strict(list(labels), list(labels.values()), default=thread,
                                              return_dtype=pl.String)
    stream = pl.format("stream {}", pl.col("stream_id"))
    lane = pl.when(pl.col("tid").is_not_null()).then(thread).when(pl.col("stream_id").is_not_null()).then(stream)
    return lane.otherwise(pl.lit(otherwise, dtype=pl.String))


def pct(part: float | int | None, whole: float | int | None) -> float | None:
    """100 × part / whole rounded to 4 decimals, or None when whole is 0 or unknown (the ``_pct`` convention).
    A share that rounding would make 0 or 100 while it is not (1,350 ns of 4.262 s) keeps its figures, so that it
    reads "<0.1%" or ">99.9%", not "0.0%" or "100.0%".

    >>> pct(1, 3), pct(5, 0)
    (33.3333, None)
    """
    if part is None or not whole:
        return None
    share = 100.0 * part / whole
    shown = round(share, 4)
    if (shown == 0) != (share == 0) or (abs(shown) == 100) != (abs(share) == 100):
        return share  # a share above none, or under the whole, that 4 decimals would make none or the whole
    return shown


def gbps(nbytes: int | None, ns: int | None) -> float | None:
    """Bytes per nanosecond, i.e. GB/s with 1 GB = 10⁹ bytes, rounded to 4 decimals, or to 4 significant figures
    where those are more (24 B in 7.681 us is 0.003125 GB/s, not 0.0031, which reads "0.003100"); None without
    time.

    >>> gbps(3_000, 1_000), gbps(24, 7_681)
    (3.0, 0.003125)
    """
    if nbytes is None or not ns:
        return None
    rate = nbytes / ns
    return round(rate, max(4, 3 - math.floor(math.log10(abs(rate))))) if rate else 0.0


# =============================================================================================================
# Collectives (issue 10): which events are communication, and which collective each one is.
#
# One table recognises the names of communication events in every format, across NCCL's renames, and one
# table says which collective a name is, where the name says it. A reader that knows more (torch's
# ``record_param_comms`` arguments, Kineto's collective arguments on NCCL kernels) fills the ``collective``
# column itself; :func:`collective_of` gives the column with the names' verdict filled in where it is null.
# =============================================================================================================

#: (family, regular expression on the name as written, case-insensitive): names of communication events.
#: The first match wins; a name matching none is not communication.
COMMUNICATION_NAMES: list[tuple[str, str]] = [
    # NCCL/RCCL kernels of every NCCL version: ncclAllReduceRingLLKernel_sum_f32 and ncclSendRecvKernel_copy_i8
    # (<= 2.7), ncclKernel_AllReduce_RING_LL_Sum_float (2.8-2.18), ncclDevKernel_AllReduce_Sum_f32_RING_LL,
    # ncclDevKernel_SendRecv and ncclDevKernel_Generic (2.19 on, and RCCL), ncclDevKernelDebug_Generic (RCCL)
    ("nccl kernel", r"^(void\s+)?(nccl|rccl)\w*kernel"),
    # MSCCL kernels (RCCL): mscclKernel_Sum_float_LL_...
    ("msccl kernel", r"^(void\s+)?msccl\w*kernel"),
    # collectives as kernels of their own (:data:`DIRECT_COLLECTIVE`: PyTorch symmetric memory, vLLM, TRT-LLM)
    ("direct collective kernel", DIRECT_COLLECTIVE),
    # torch.distributed operators: c10d::allreduce_, c10d::broadcast_, _c10d_functional::all_gather_into_tensor
    ("c10d op", r"^_?c10d(_functional)?::"),
    # Kineto's collective record (its collective is in its arguments; the reader fills it)
    ("record_param_comms", r"^record_param_comms$"),
    # process-group annotations: gloo:all_reduce, nccl:all_reduce
    ("process-group annotation", r"^(gloo|nccl|ucc|mpi):"),
    # NCCL calls as nsys and NVTX show them (NVTX domain NCCL): ncclAllReduce, ncclBroadcast, ncclSend, ...
    ("nccl call", r"^nccl(allreduce|broadcast|bcast|reduce|allgather|reducescatter|alltoall|send|recv|gather"
                  r"|scatter)"),
    # XLA's collective operations (JAX, TensorFlow): all-reduce-start.1, all-gather-done, reduce-scatter.3
    ("xla collective", XLA_COLLECTIVE),
]

#: (collective, regular expression) on a communication name lower-cased with the parameter list dropped and
#: every character but letters and digits removed (``ncclDevKernel_AllReduce_Sum_f32_RING_LL(...)`` ->
#: ``nccldevkernelallreducesumf32ringll``, ``c10d::allreduce_`` -> ``c10dallreduce``). The first match wins,
#: so a longer name comes before the shorter one it contains (all_reduce before reduce).
COLLECTIVES: list[tuple[str, str]] = [
    ("all_reduce", r"allreduce|crossdevicereduce"),
    ("reduce_scatter", r"reducescatter"),
    ("all_gather", r"allgather"),
    ("all_to_all", r"alltoall"),
    ("send_recv", r"sendrecv"),
    ("broadcast", r"broadcast|bcast"),
    ("reduce", r"reduce"),
    ("gather", r"gather"),
    ("scatter", r"scatter"),
    ("send", r"send"),
    ("recv", r"recv"),
    ("barrier", r"barrier"),
]
#: The collective of a communication kernel whose name does not say (RCCL's ``ncclDevKernel_Generic``, MSCCL).
UNKNOWN_COLLECTIVE = "unknown"


def communication_family(names: pl.Expr) -> pl.Expr:
    """The family (:data:`COMMUNICATION_NAMES`) of each communication name; null for any other name.

    >>> names = pl.Series(["ncclKernel_AllReduce_RING_LL_Sum_float", "c10d::allreduce_", "volta_sgemm_128x64"])
    >>> pl.select(communication_family(pl.lit(names))).to_series().to_list()
    ['nccl kernel', 'c10d op', None]
    """
    return names.map_batches(_classifier(COMMUNICATION_NAMES, None, "lowercase"), return_dtype=pl.String,
                             is_elementwise=True)


def collective(names: pl.Expr) -> pl.Expr:
    """The collective each name is (:data:`COLLECTIVES`), null for names that are not communication.

    A communication kernel whose name does not say its collective is :data:`UNKNOWN_COLLECTIVE`; any other
    communication name that says none (``c10d::wait``, ``record_param_comms``, ``ncclGroupEnd``) is null.

    >>> names = pl.Series(["ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)",
    ...                    "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
    ...                    "ncclDevKernel_Generic(ncclDevKernelArgsStorage<4096ul>)", "c10d::broadcast_",
    ...                    "gloo:all_reduce", "ncclSendRecvKernel_copy_i8(ncclColl)", "reduce_kernel"])
    >>> pl.select(collective(pl.lit(names))).to_series().to_list()
    ['all_reduce', 'all_reduce', 'unknown', 'broadcast', 'all_reduce', 'send_recv', None]

    The patterns run once per distinct name (a trace of 300,000 rows has a few thousand), and the answers are
    joined back: the same values as running them on every row, in a fraction of the time.
    """
    return names.map_batches(_collective_of_distinct, return_dtype=pl.String, is_elementwise=True)


def _collective_of_distinct(names: pl.Series) -> pl.Series:
    """:func:`collective` of a Series, worked out once per distinct value (and remembered: :func:`first_match`)."""
    return _COLLECTIVE_OF(names.cast(pl.String)).alias(names.name)


class _CollectiveOf(_Classifier):
    """:func:`collective` as a :class:`_Classifier`: each distinct name's collective worked out once, step by
    step (each regular expression run once on the names, not once per branch of a chain)."""

    def __init__(self):
        self.default, self.memo = None, {}

    def classify(self, names: pl.Series) -> list:
        found: list = [None] * names.len()
        # every pattern is tried on communication names only (any other name has no collective)
        rows = names.str.to_lowercase().str.contains(_ANY_COMMUNICATION).arg_true().to_list()
        if rows:
            picked = names.gather(rows)
            family = _classifier(COMMUNICATION_NAMES, None, "lowercase")(picked).to_list()
            said = _classifier(COLLECTIVES, "", "collective key")(picked).to_list()
            for i, fam, say in zip(rows, family, said):
                if fam is not None:
                    found[i] = say if say else (UNKNOWN_COLLECTIVE if fam in ("nccl kernel", "msccl kernel",
                                                                           "direct collective kernel")
                                                else None)
        return found


_COLLECTIVE_OF = _CollectiveOf()


#: Any name of :data:`COMMUNICATION_NAMES` (lower-cased), in one regular expression.
_ANY_COMMUNICATION = "|".join(f"(?:{pattern})" for _, pattern in COMMUNICATION_NAMES)


def normalize_collective(names: pl.Expr) -> pl.Expr:
    """A collective name as a trace writes it (Kineto's ``"Collective name"``: ``allreduce``, ``_allgather_base``,
    ``reduce_scatter_tensor_coalesced``) in :data:`COLLECTIVES`' words; null when it is none (``wait``).

    >>> pl.select(normalize_collective(pl.lit(pl.Series(["allreduce", "_allgather_base", "wait"])))).to_series().to_list()
    ['all_reduce', 'all_gather', None]
    """
    return names.map_batches(_classifier(COLLECTIVES, None, "collective key"), return_dtype=pl.String,
                             is_elementwise=True)


def collective_of() -> pl.Expr:
    """The ``collective`` column, filled from the name (:func:`collective`) where the reader left it null."""
    return pl.coalesce(pl.col("collective"), collective(pl.col("name").fill_null(""))).alias("collective")


def is_communication() -> pl.Expr:
    """True for communication events: a collective filled in by the reader or recognised from the name."""
    return collective_of().is_not_null()


# =============================================================================================================
# Spellings (issue 11): the same work named by different tools. ``traceparse diff`` matches names that no
# exact comparison pairs through these tables: one spelling key per name, equal keys are the same work.
# =============================================================================================================

#: (canonical name, regular expression searched in the lower-cased name): copies and memsets as each tool
#: writes them. nsys ``[CUDA memcpy Host-to-Device]``, nvprof ``[CUDA memcpy HtoD]``, torch.profiler / Kineto
#: ``Memcpy HtoD (Pinned -> Device)``, ROCm Kineto ``Memcpy DtoD (Device -> Device)``; nsys ``[CUDA memset]``,
#: torch ``Memset (Device)``. The first match wins; the direction words follow :data:`traceparse.schema.COPY_KINDS`.
COPY_SPELLINGS: list[tuple[str, str]] = [
    ("memcpy HtoD", r"memcpy.*\b(htod|host-to-device|host to device)\b"),
    ("memcpy DtoH", r"memcpy.*\b(dtoh|device-to-host|device to host)\b"),
    ("memcpy DtoD", r"memcpy.*\b(dtod|device-to-device|device to device)\b"),
    ("memcpy HtoH", r"memcpy.*\b(htoh|host-to-host|host to host)\b"),
    ("memcpy PtoP", r"memcpy.*\b(ptop|peer-to-peer|peer to peer)\b"),
    ("memset", r"memset"),
]

#: (regular expression, replacement, what it unifies): rewrites that make two spellings of one demangled C++
#: kernel name equal, applied in order after the parameter lists are dropped (:func:`spelling_key`). nsys
#: (and the CUDA demangler) writes template arguments as casts and lambdas in brackets; torch.profiler
#: (the GNU demangler) as literals and lambdas in braces; spacing differs everywhere.
TEMPLATE_SPELLINGS: list[tuple[str, str, str]] = [
    (r"<unnamed>|\(anonymous namespace\)", "(anon)", "nsys <unnamed> = torch (anonymous namespace)"),
    (r"\[lambda\(([^()]*)\) \(instance (\d+)\)\]", r"{lambda(\1)#\2}", "[lambda(int) (instance 1)] = {lambda(int)#1}"),
    (r"\(bool\)1\b", "true", "(bool)1 = true"),
    (r"\(bool\)0\b", "false", "(bool)0 = false"),
    (r"\((?:(?:unsigned|signed) )?(?:char|short|int|long|long long|unsigned)\)(-?\d+)", r"\1",
     "(int)10 = 10, (unsigned long)2 = 2"),
    (r"\b(\d+)(?:ull|ul|ll|u|l)\b", r"\1", "2ul = 2"),
    (r"\bunsigned int\b", "unsigned", "unsigned int = unsigned"),
    (r"\bconst ([\w:]+)", r"\1 const", "const float = float const"),
    (r"([<,])\s*void\s+", r"\1", "a function in a template argument: nsys writes its return type, torch not"),
    (r"\s*([<>,*&()\[\]{}])\s*", r"\1", "spacing: > > = >>, char * = char*"),
]


def _drop_parameter_lists(name: str) -> str:
    """``name`` without every parenthesised group that follows a name (a function's parameter list, also
    those of functions nested in template arguments); casts such as ``(cudnnKernelDataType_t)0`` stay."""
    out: list[str] = []
    last = ""  # the last character kept that is not a space
    depth = 0
    for ch in name:
        if depth:
            depth += (ch == "(") - (ch == ")")
            continue
        if ch == "(" and last and (last.isalnum() or last in "_>)"):
            while out and out[-1].isspace():  # ``operator ()(...)`` as ``operator()(...)``
                out.pop()
            depth = 1
            continue
        out.append(ch)
        if not ch.isspace():
            last = ch
    return "".join(out)


def spelling_key(kind: str, name: str) -> str:
    """The key under which two tools' names of the same ``kind`` of work are equal.

    Copies and memsets: the canonical name of :data:`COPY_SPELLINGS` (the name as written when none
    matches). API calls: the name without the CUPTI interface version (``cudaLaunchKernel_v7000``).
    Kernels: without ``void``, parameter lists dropped, then :data:`TEMPLATE_SPELLINGS` applied.
    A mangled name (``_Z...``) is its own key: it spells nothing to compare.

    >>> spelling_key("memcpy", "[CUDA memcpy Host-to-Device]") == spelling_key("memcpy", "Memcpy HtoD (Pinned -> Device)")
    True
    >>> spelling_key("kernel", "void f<float, (int)10, (bool)1>(T1 *, int)")
    'f<float,10,true>'
    >>> spelling_key("kernel", "void f<float, 10, true>(float*, int)")
    'f<float,10,true>'
    """
    import re

    if kind in ("memcpy", "memset"):
        lowered = name.lower()
        return next((canonical for canonical, pattern in COPY_SPELLINGS if re.search(pattern, lowered)), name)
    if kind == "api":
        return re.sub(r"_v\d+$", "", name)
    if kind != "kernel" or name.startswith("_Z"):
        return name
    s = re.sub(r"^(?:__global__\s+)?void\s+", "", name.strip())
    for pattern, replacement, _ in TEMPLATE_SPELLINGS[:2]:  # before parameter lists go: lambdas keep their number
        s = re.sub(pattern, replacement, s)
    s = _drop_parameter_lists(s)
    for pattern, replacement, _ in TEMPLATE_SPELLINGS[2:]:
        s = re.sub(pattern, replacement, s)
    return s
