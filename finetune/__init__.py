"""Per-task finetuning (VQA, VCR, RefCOCO+, VQG)."""
