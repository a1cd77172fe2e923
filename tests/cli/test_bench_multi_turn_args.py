"""`disaggsdk bench --dataset-name multi-turn`: its flags' defaults, and bad values refused with exit 2
before anything is sent or launched."""

from __future__ import annotations

import pytest

from disaggsdk.cli import bench_args
from disaggsdk.cli.main import build_parser


def parse(*argv: str):
    return build_parser().parse_args(["bench", "http://h:1", "--dataset-name", "multi-turn", *argv])


def test_a_user_message_is_64_tokens_unless_input_len_is_given():
    shape = bench_args.multi_turn_shape(parse())
    assert (shape.turns, shape.system_len, shape.user_len, shape.output_len) == (4, 512, 64, 64)
    assert parse().input_len == 256  # the random dataset's default is untouched
    assert bench_args.multi_turn_shape(parse("--input-len", "256")).user_len == 256  # given: taken as it is
    assert bench_args.multi_turn_shape(parse("--random-input-len", "9", "--output-len", "5")).user_len == 9
    args = parse("--multi-turn-turns", "2", "--multi-turn-system-len", "0", "--multi-turn-think-s", "1.5")
    assert bench_args.multi_turn_shape(args).turns == 2 and bench_args.load_shape(args).think_time_s == 1.5
    assert bench_args.dataset_name(parse("--dataset-path", "chats.json")) == "multi-turn"


@pytest.mark.parametrize("target", ["http://127.0.0.1:9", "specs/tiny_local.yaml"])  # nothing listens / launches
@pytest.mark.parametrize("argv, message", [
    (["--multi-turn-turns", "0"], "--multi-turn-turns must be >= 1"),
    (["--multi-turn-system-len", "-1"], "--multi-turn-system-len must be >= 0"),
    (["--multi-turn-think-s", "-2"], "--multi-turn-think-s must be a number of seconds >= 0"),
    (["--endpoint", "/v1/chat/completions"], "give --dataset-path FILE"),
])
def test_bad_multi_turn_values_exit_2_with_the_fix(run_cli, target, argv, message):
    p = run_cli("bench", target, "--dataset-name", "multi-turn", *argv)
    assert p.returncode == 2 and message in " ".join(p.stderr.split()) and "Traceback" not in p.stderr
