"""NVIDIA's facts, kept in one place: how the GPU Operator (operator), the device plugin (device_plugin) and the
Container Toolkit (toolkit) behave, as their sources and gpushare's pinned copies in gpushare/data say. Facts and
parsing only: the rules that judge them are in gpushare.policy, the values gpushare sets in gpushare.program."""
