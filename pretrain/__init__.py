"""VL-BERT pretraining: masking, tasks and losses, the training engine, the entry point."""
