"""`losses.mrc_attribute_targets: shards` checks at start that the caption shards carry attribute distributions of
the model's width, naming the shard, instead of failing in the first step on every rank."""

import io
import tarfile

import pytest

from model.config import ConfigError
from pretrain.run import check_stored_attributes


def test_shards_without_or_with_other_attribute_distributions_are_refused_naming_the_shard(demo_corpus, tmp_path):
    shards = demo_corpus / "shards" / "captions-train"
    check_stored_attributes(str(shards / "*.tar"), 6)  # the demo's colours
    first = sorted(shards.glob("*.tar"))[0]
    with pytest.raises(ConfigError, match=rf"{first}:000000000 holds 6 attributes per box, model.fast_rcnn."
                                          r"num_attributes is 3"):
        check_stored_attributes(str(shards / "*.tar"), 3)
    # the same shard as written before attribute distributions existed: every member but attrs.npy
    old = tmp_path / "old-000000.tar"
    with tarfile.open(first) as src, tarfile.open(old, "w") as dst:
        for member in src:
            if not member.name.endswith(".attrs.npy"):
                dst.addfile(member, io.BytesIO(src.extractfile(member).read()))
    with pytest.raises(ConfigError, match=rf"{old} carries no attribute distributions \(attrs.npy.*--force"):
        check_stored_attributes(str(tmp_path / "*.tar"), 6)
