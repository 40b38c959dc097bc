"""Dumped tensors: the safetensors files (``files``: encode once, memory-map on read) and the
samples' metadata they carry (``schema``).
"""
