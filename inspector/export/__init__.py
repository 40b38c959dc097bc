"""Exports: a run's statistics as TensorBoard runs and tags (``tensorboard``), the event files
(``tfevents``) and their records' CRC-32C (``crc32c``).
"""
