"""Tracing a PyTorch step: module outputs (trace), every aten op with its call site (aten_trace), and a fault injected into one aten op's output (aten_fault)."""
