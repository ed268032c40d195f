"""fwd v07's config choice at full-width D = 128 (kernels/fwd/v07_overlap.cu, Launch): the few-keys config (B_c 128,
persistent) up to 2048 keys, and non-causal calls up to SHORT_PAD_MAX_SK keys where B_c 128 pads S_k by 1 % less
than the long config's B_c 176; lab.fwd.tile_race.d128_config mirrors it. CPU only: the mirror against the
kernel's own knob defaults and the rule's text, and the picks the measurements were made at."""
from __future__ import annotations

import re

import pytest

from lab import paths
from lab.fwd import tile_race


def test_the_mirror_reads_every_knob_of_the_rule():
    knobs = tile_race.kernel_defaults()
    assert set(knobs) == {"LAB_FWD_OVERLAP_D128_BC", "LAB_FWD_OVERLAP_D128_SHORT_BC", "LAB_FWD_OVERLAP_D128_SHORT_MAX_SK",
                          "LAB_FWD_OVERLAP_D128_SHORT_MAX_SQ_CAUSAL", "LAB_FWD_OVERLAP_D128_SHORT_PAD_MAX_SK"}
    assert knobs["LAB_FWD_OVERLAP_D128_SHORT_BC"] < knobs["LAB_FWD_OVERLAP_D128_BC"]


def test_the_kernel_states_the_rule_the_mirror_follows():
    launch = (paths.KERNELS / "fwd" / "v07_overlap.cu").read_text().split("struct Launch {")[1].split("\n};")[0]
    code = re.sub(r"\s+", " ", launch)
    assert "p.seqlen_k <= LAB_FWD_OVERLAP_D128_SHORT_MAX_SK ||" in code
    assert "p.seqlen_k <= LAB_FWD_OVERLAP_D128_SHORT_PAD_MAX_SK && pad_short * 100 <= pad_long * 99" in code
    assert "kShortBC = Cfg128Short::BC, kLongBC = Cfg::BC" in code


@pytest.mark.parametrize("seqlen,causal,config", [
    (2048, False, "few-keys"), (2049, False, "long"),  # 2112 keys of work at B_c 176 against 2176 at 128
    (2160, False, "few-keys"), (2560, False, "few-keys"), (3000, False, "few-keys"),
    (3500, False, "long"), (4000, False, "long"),  # B_c 176 pads less: 3520 / 4048 against 3584 / 4096
    (4096, False, "few-keys"),  # the weak cell: 4096 keys of work against 4224
    (4097, False, "long"), (4224, False, "long"),  # both pad to 4224
    (4352, False, "few-keys"), (4400, False, "long"), (4608, False, "few-keys"),  # 4608 against 4752
    (5120, False, "long"), (8192, False, "long"),  # above SHORT_PAD_MAX_SK (5120 would pad less at 128)
    (2048, True, "few-keys"), (4096, True, "long"),  # causal calls: by S_q, the rule unchanged
])
def test_picks(seqlen, causal, config):
    assert tile_race.d128_config(seqlen, seqlen, causal) == config


def test_the_race_builds_mean_what_they_say():
    assert tile_race.d128_config(4096, 4096, False, tile_race.BUILDS["pad-rule-off"]) == "long"
    assert tile_race.d128_config(8192, 8192, False, tile_race.BUILDS["few-keys-all"]) == "few-keys"
    assert tile_race.d128_config(4096, 4096, False, tile_race.BUILDS["default"]) == "few-keys"
