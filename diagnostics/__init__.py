"""How much a model uses each modality, on any export: the cross-modal input ablation (Frank et al. 2021;
`python -m diagnostics.ablation`) and the grounding tables (masked words per category with and without the image,
masked-region classification by what the model could see; `python -m diagnostics.grounding`). Pretraining's
periodic evaluation uses them; nothing here imports pretraining.

data.py        the held-out phrases in Flickr30k Entities' format, their gold regions and targets
conditions.py  the ablated inputs (none, object, all, ...) and one pass of the diagnostic over a model
statistics.py  bootstrap intervals clustered by image, paired tests
plots.py       the figures
config.py      DiagnosticConfig, GroundingConfig"""
