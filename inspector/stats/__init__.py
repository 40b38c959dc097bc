"""Statistics parts (Parquet): their schema (``schema``), compaction and which parts and row groups
to read (``parts``), level merges (``merge``), step-binned summaries (``summary``), one digest per
summary-less part (``digest``), and the histogram columns of a row (``histograms``).
"""
