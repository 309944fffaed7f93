"""VL-BERT as plain nn.Modules: config, embeddings, encoder, Fast R-CNN, heads, weight import.

Nothing here imports from `pretrain`, `finetune` or `shards`."""
