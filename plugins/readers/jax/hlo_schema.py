"""The part of XLA's ``HloProto`` the reader needs, built at run time from its published field numbers.

JAX's profiler stores each compiled program in the XSpace's ``/host:metadata`` plane: an event metadata
named ``jit_step(135012)`` (module name and program id) whose ``Hlo Proto`` stat holds the serialized
``xla.HloProto`` of the optimized module, the same module whose kernels the device planes time. Only the
fields below are described (protobuf skips the others: literals, shardings, buffer assignment); the numbers
are those of ``xla/service/hlo.proto`` and ``xla/xla_data.proto`` (openxla/xla, package ``xla``), built
with :func:`.xspace_schema.build_classes` for the reasons given there. Enums are read as ``int32``.

* ``HloProto``: hlo_module 1
* ``HloModuleProto``: name 1, entry_computation_name 2, computations 3, id 5, entry_computation_id 6,
  schedule 7 (``HloScheduleProto``: sequences 1, a map computation id → ``InstructionSequence``:
  instruction_ids 1)
* ``HloComputationProto``: name 1, instructions 2, id 5, root_id 6
* ``HloInstructionProto``: name 1, opcode 2, shape 3, fusion_kind 11, window 15,
  convolution_dimension_numbers 16, custom_call_target 28, dot_dimension_numbers 30, id 35, operand_ids 36,
  called_computation_ids 38, backend_config 43 (bytes: JSON for GPU fusions and library calls),
  feature_group_count 50, precision_config 51
* ``ShapeProto``: element_type 2 (``PrimitiveType``), dimensions 3, tuple_shapes 4
* ``DotDimensionNumbers``: lhs_contracting 1, rhs_contracting 2, lhs_batch 3, rhs_batch 4
* ``ConvolutionDimensionNumbers``: input_batch 7, input_feature 8, input_spatial 11, kernel_input_feature 3,
  kernel_output_feature 4, kernel_spatial 6, output_batch 9, output_feature 10, output_spatial 12
* ``Window``: dimensions 1 (``WindowDimension``: size 1, stride 2, padding_low 3, padding_high 4,
  window_dilation 5, base_dilation 6)
* ``PrecisionConfig``: operand_precision 1 (DEFAULT 0, HIGH 1, HIGHEST 2), algorithm 2
"""

from __future__ import annotations

from functools import lru_cache

from traceparse_plugins.readers.jax.xspace_schema import build_classes

PACKAGE = "xla"
_O, _R = "optional", "repeated"
_MESSAGES = {
    "HloProto": [("hlo_module", 1, "message", _O, "HloModuleProto", None)],
    "HloModuleProto": [("name", 1, "string", _O, None, None), ("entry_computation_name", 2, "string", _O, None, None),
                       ("computations", 3, "message", _R, "HloComputationProto", None),
                       ("id", 5, "int64", _O, None, None), ("entry_computation_id", 6, "int64", _O, None, None),
                       ("schedule", 7, "message", _O, "HloScheduleProto", None)],
    "HloScheduleProto": [("sequences", 1, "message", _R, "HloScheduleProto.SequencesEntry", None)],
    "InstructionSequence": [("instruction_ids", 1, "int64", _R, None, None)],
    "HloComputationProto": [("name", 1, "string", _O, None, None),
                            ("instructions", 2, "message", _R, "HloInstructionProto", None),
                            ("id", 5, "int64", _O, None, None), ("root_id", 6, "int64", _O, None, None)],
    "HloInstructionProto": [
        ("name", 1, "string", _O, None, None), ("opcode", 2, "string", _O, None, None),
        ("shape", 3, "message", _O, "ShapeProto", None), ("fusion_kind", 11, "string", _O, None, None),
        ("window", 15, "message", _O, "Window", None),
        ("convolution_dimension_numbers", 16, "message", _O, "ConvolutionDimensionNumbers", None),
        ("custom_call_target", 28, "string", _O, None, None),
        ("dot_dimension_numbers", 30, "message", _O, "DotDimensionNumbers", None),
        ("id", 35, "int64", _O, None, None), ("operand_ids", 36, "int64", _R, None, None),
        ("called_computation_ids", 38, "int64", _R, None, None), ("backend_config", 43, "bytes", _O, None, None),
        ("feature_group_count", 50, "int64", _O, None, None),
        ("precision_config", 51, "message", _O, "PrecisionConfig", None)],
    "ShapeProto": [("element_type", 2, "int32", _O, None, None), ("dimensions", 3, "int64", _R, None, None),
                   ("tuple_shapes", 4, "message", _R, "ShapeProto", None)],
    "DotDimensionNumbers": [("lhs_contracting_dimensions", 1, "int64", _R, None, None),
                            ("rhs_contracting_dimensions", 2, "int64", _R, None, None),
                            ("lhs_batch_dimensions", 3, "int64", _R, None, None),
                            ("rhs_batch_dimensions", 4, "int64", _R, None, None)],
    "ConvolutionDimensionNumbers": [
        ("input_batch_dimension", 7, "int64", _O, None, None), ("input_feature_dimension", 8, "int64", _O, None, None),
        ("input_spatial_dimensions", 11, "int64", _R, None, None),
        ("kernel_input_feature_dimension", 3, "int64", _O, None, None),
        ("kernel_output_feature_dimension", 4, "int64", _O, None, None),
        ("kernel_spatial_dimensions", 6, "int64", _R, None, None),
        ("output_batch_dimension", 9, "int64", _O, None, None),
        ("output_feature_dimension", 10, "int64", _O, None, None),
        ("output_spatial_dimensions", 12, "int64", _R, None, None)],
    "Window": [("dimensions", 1, "message", _R, "WindowDimension", None)],
    "WindowDimension": [("size", 1, "int64", _O, None, None), ("stride", 2, "int64", _O, None, None),
                        ("padding_low", 3, "int64", _O, None, None), ("padding_high", 4, "int64", _O, None, None),
                        ("window_dilation", 5, "int64", _O, None, None), ("base_dilation", 6, "int64", _O, None, None)],
    "PrecisionConfig": [("operand_precision", 1, "int32", _R, None, None), ("algorithm", 2, "int32", _O, None, None)],
}
_MAP_ENTRIES = {"HloScheduleProto": [("SequencesEntry", "InstructionSequence")]}


@lru_cache(maxsize=1)
def hlo_proto_class():
    """The ``xla.HloProto`` message class (protobuf imported here, so the reader loads without it)."""
    return build_classes("traceparse_hlo.proto", PACKAGE, _MESSAGES, map_entries=_MAP_ENTRIES)["HloProto"]
