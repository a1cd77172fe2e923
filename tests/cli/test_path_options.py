"""Every path the CLI takes (issue 55, finding 7): one that cannot be read or written is one line and exit 2, before
the command does any work, never a traceback (`--log-dir /proc/x` was one). Fuzzed: random unusable paths for every
path option of every command, and for every argument that names a spec, trace, profile or model by its path."""

import random

import pytest

from disaggsdk.cli.main import build_parser, main
from disaggsdk.cli.path_options import PathOption
from disaggsdk.errors import printable

# the rest of a command line that would run, for each command with a path option: the fuzzed path is the only fault
BASE_ARGV = {
    "launch": ["launch", "specs/tiny_local.yaml", "--print-spec"],
    "bench": ["bench", "http://127.0.0.1:9"],
    "compare": ["compare", "code-assistant", "--slo", "ttft=1000,tpot=100"],
    "calibrate": ["calibrate"],
    "tune": ["tune", "qwen3-coder", "--gpus", "8", "--slo", "itl_p99_ms=60", "--request-rate", "1"],
    # a GPU spec: a CPU one needs this machine's calibrated profile, which a fresh HOME has not (its error comes first)
    "simulate": ["simulate", "specs/r1_tp.yaml"],
}
# arguments that are a path or a name (a SPEC or URL, a profile, a catalog model): checked where they are read
NAMED_BY_PATH = [
    ["validate", "P"], ["plan", "P"], ["simulate", "P"], ["kv-bench", "P"], ["launch", "P", "--print-spec"],
    ["bench", "P"], ["compare", "P", "--slo", "ttft=1000"], ["compare", "code-assistant", "P", "--slo", "ttft=1000"],
    ["compare", "code-assistant", "--machine-spec", "P", "--slo", "ttft=1000"], ["calibrate", "--deployment", "P"],
    ["generate", "--spec", "P", "--prompt", "a"], ["generate", "--model", "P", "--prompt", "a"],
    ["launch", "--model", "P", "--device", "cpu", "--print-spec"], ["serve", "--model", "P"],
    ["calibrate", "--model", "P"], BASE_ARGV["tune"][:1] + ["P"] + BASE_ARGV["tune"][2:],
    BASE_ARGV["tune"] + ["--profile", "P"], ["simulate", "specs/tiny_local.yaml", "--profile", "P"],
    ["simulate", "specs/tiny_local.yaml", "--mtp-acceptance", "P"],
]
PATHS_PER_OPTION = 8


def unusable_path(rng: random.Random, kind: str) -> str:
    """A path no command can use as ``kind``: under /proc or /sys (nothing can be made there, not even by root),
    below a file, a name past NAME_MAX, a folder given as a file, a file that fails as it is read; its last part
    random, with a newline, rich markup, a byte that is not UTF-8 or a space in it at times."""
    name = "".join(rng.choice("abc.-_ ") for _ in range(rng.randint(1, 12)))
    name += rng.choice(["", "", "\n", "[/]", "[bold]", "\udcff", " x", "*"])
    if rng.random() < 0.15:
        name = "n" * rng.randint(256, 5000)  # ENAMETOOLONG
    unmakeable = ["/proc/", "/proc/self/", "/sys/", "/etc/hostname/", "/proc/version/", "/sys/kernel/"]
    if kind == "input file":
        prefixes = unmakeable + ["/nonexistent/", "/tmp/no-such-folder-55/"]
        whole = ["/", "/etc", "/proc", "/tmp", "/proc/self/mem", "/proc/self/fd"]
    else:
        prefixes = [p + rng.choice(["", "a/", "a/b/"]) for p in unmakeable]
        whole = ["/proc/version", "/proc/self/mem", "/sys/kernel/x"] + (["/", "/etc", "/proc"] if kind == "output file"
                                                                         else ["/etc/hostname"])
    return rng.choice(whole) if rng.random() < 0.2 else rng.choice(prefixes) + name


def one_error_line(argv: list[str], capsys) -> tuple[int, str]:
    capsys.readouterr()
    code = main(argv)
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) <= 2, (argv, code, err[-2000:])
    errors = [line for line in lines if "error" in line]
    assert len(errors) == 1, (argv, err[-2000:])
    return code, errors[0]


def path_options_by_command() -> dict[str, list[PathOption]]:
    parser = build_parser()
    commands = next(a for a in parser._actions if a.dest == "command").choices
    return {name: list(cmd.get_default("path_options")) for name, cmd in commands.items()
            if cmd.get_default("path_options")}


def test_every_path_option_is_fuzzed():
    options = path_options_by_command()
    assert set(options) == set(BASE_ARGV), "give a new command with a path option its line in BASE_ARGV"
    flags = {o.option_strings[0] for opts in options.values() for o in opts}
    assert flags >= {"--log-dir", "--output", "--result-dir", "--dataset-path", "--plot", "--trace"}


def test_log_dir_under_proc_is_one_line_and_exit_2(run_cli):
    # was a traceback from the launcher's makedirs
    result = run_cli("launch", "specs/tiny_local.yaml", "--log-dir", "/proc/x", "--no-live", timeout_s=60)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert result.stderr.strip() == "error: --log-dir /proc/x: cannot make the folder (no such file or directory)"


@pytest.mark.parametrize("command", sorted(BASE_ARGV))
def test_fuzzed_unusable_paths_for_every_path_option_are_one_line_and_exit_2(command, capsys):
    rng = random.Random(f"issue 55 {command}")
    for option in path_options_by_command()[command]:
        flag = option.option_strings[0]
        for _ in range(PATHS_PER_OPTION):
            path = unusable_path(rng, option.kind)
            _, line = one_error_line(BASE_ARGV[command] + [flag, path], capsys)
            # the option, or where a file passed the check and fails as it is read (/proc/self/mem), the path
            assert f"error: {flag} " in line or f"error: {flag}:" in line or printable(path) in line, (path, line)
    if command == "bench":  # --result-filename: a name inside --result-dir, checked before a run too
        for _ in range(PATHS_PER_OPTION):
            path = unusable_path(rng, "output file")
            _, line = one_error_line(BASE_ARGV[command] + ["--result-filename", path], capsys)
            assert "--result-filename" in line, (path, line)


@pytest.mark.parametrize("template", NAMED_BY_PATH, ids=lambda argv: " ".join(argv))
def test_fuzzed_unusable_paths_where_a_spec_trace_profile_or_model_is_named_are_one_line_and_exit_2(template, capsys):
    rng = random.Random(f"issue 55 {' '.join(template)}")
    for _ in range(PATHS_PER_OPTION):
        path = unusable_path(rng, "input file")
        one_error_line([path if arg == "P" else arg for arg in template], capsys)
