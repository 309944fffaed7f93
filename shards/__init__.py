"""Everything between raw corpora and batches: shard writers, the detector pass, streaming readers,
1:1 caption/text mixing, collation and the synthetic demo corpus."""
