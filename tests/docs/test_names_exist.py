"""Every module, spec key, repository path and CLI command that README.md, docs/ and the docstrings
and comments of disaggsdk/ and tools/ name exists (`tests.docs.named_things` says what is read and
how each is resolved against the code). It caught `launch.unit_reach`, a module named in two
docstrings that never existed under that name.

The tests below the first show that the checker can fail: on a text naming a module, key, path,
command or flag that does not exist, and on the real tree with a module taken away.
"""

from __future__ import annotations

import shutil

import pytest

from tests.conftest import ROOT
from tests.docs import named_things
from tests.docs.named_things import Mention, Snippet, dangling, mention_problem, snippet_mentions

# (page, kind) whose names mean something else there; each says why
NOT_READ: dict[tuple[str, str], str] = {
    # its dotted names are paths of the plan's JSON (`kv.dtype_bytes`), not of the spec; the plan's
    # own test (tests/plan/test_plan_json.py) holds them against Plan.to_json
    ("docs/plan-json.md", "spec key"): "plan JSON paths",
}


def read_files() -> list:
    return [*named_things.markdown_pages(), *named_things.package_sources(),
            *sorted((ROOT / "tools").rglob("*.py"))]


def problems_outside_the_exceptions(paths) -> list[str]:
    out = []
    for line in dangling(paths):
        where, kind = line.split(": ", 2)[:2]
        page = where.rsplit(":", 1)[0]
        kind = kind.split(" `")[0]
        if (page, kind) not in NOT_READ:
            out.append(line)
    return out


def test_every_name_in_the_docs_docstrings_and_comments_exists():
    problems = problems_outside_the_exceptions(read_files())
    assert not problems, "these name nothing that exists (fix the text, or the name):\n" + "\n".join(problems)


def test_the_checker_reads_each_kind_of_name():
    found = {kind: 0 for kind in ("module", "spec key", "path", "command")}
    for path in read_files():
        for mention in named_things.mentions_in(path):
            found[mention.kind] += 1
    # the real tree names dozens of each: a checker that reads none would pass anything
    assert all(count > 20 for count in found.values()), found


def problem_of(text: str, source_name: str = "docs/page.md") -> list[str]:
    """The problems of the names a code span ``text`` on a page (or in a module) spells."""
    source = ROOT / source_name
    mentions = snippet_mentions(Snippet(1, text, is_code=True), source)
    return [f"{m.kind}: {problem}" for m in mentions if (problem := mention_problem(m))]


@pytest.mark.parametrize("text", [
    "launch.health", "launch.health.SilenceWatch", "disaggsdk.launch.health",
    "engine.layer_counter.host.LayerCounter", "disaggsdk.__version__", "disaggsdk.request",  # a span name the code spells
    "engine.compile", "serve.autoscale", "transport.kv_staging: host", "decode.ep: 8", "spec.serve.port",
    "launch.cuda_devices", "engine.compiled_step",  # a spec section that is also a package
    "$.kv.dtype: fp8", "$.serve.autoscale.enabled",
    "engine/compiled_step/cuda_graphs.py", "tools/gpu_check.sh", "specs/*.yaml", "native/cpu_attention",
    "disaggsdk/transfer/_fabric*.so",
    "disaggsdk plan specs/qwen3_coder.yaml --json", "disaggsdk --version -v", "disaggsdk testbed bench --input-lens 1024",
    "python -m tools.train_tiny.eval", "python -m disaggsdk.spec.reference --write",
    "torch.compile", "self.pages", "config.json", "state.num_computed_tokens",  # not ours: not read
])
def test_names_that_exist_pass(text):
    assert problem_of(text) == []


@pytest.mark.parametrize("text,problem", [
    ("launch.unit_reach", "spec key: neither a spec key nor a module"),
    ("disaggsdk.launch.unit_reach", "module: no module 'unit_reach' in disaggsdk/launch/"),
    ("engine.hooks.NoSuchCounter", "spec key: neither a spec key nor a module (disaggsdk/engine/hooks.py defines no "
                                   "'NoSuchCounter')"),
    ("report.latency", None),
    ("plan.no_such_module", "module: no module 'no_such_module' in disaggsdk/plan/"),
    ("engine.compile_mode", "spec key: neither a spec key nor a module"),
    ("$.serve.routing.policy", "spec key: neither a spec key nor a module"),  # `$.` is a key, never a module
    ("serve.autoscale.no_such_key", "spec key: neither a spec key nor a module"),
    ("engine/no_such_step.py", "path: no such file or folder in the repository"),
    ("tools/no_such_check.sh", "path: no such file or folder in the repository"),
    ("disaggsdk/transfer/_no_such_extension*.so", "path: no such file or folder in the repository"),
    ("disaggsdk deploy specs/x.yaml", "command: no command 'deploy'"),
    ("disaggsdk plan SPEC --yaml", "command: disaggsdk plan has no option --yaml"),
    ("disaggsdk testbed up --no-such-flag", "command: disaggsdk testbed up has no option --no-such-flag"),
    ("disaggsdk -v", "command: disaggsdk has no option -v"),  # -v means something only after --version
    ("python -m tools.no_such_tool", "module: no module tools.no_such_tool in the repository"),
])
def test_names_that_do_not_exist_fail(text, problem):
    got = problem_of(text)
    if problem is None:
        assert got == []
    else:
        assert got and got[0].startswith(problem), got


def test_a_docstring_names_modules_of_its_own_package_and_a_sibling_class():
    assert problem_of("cuda_vmm.CudaSharedAllocation", "disaggsdk/kv/pools/rank_pool.py") == []
    assert problem_of("cuda_vmm.NoSuchAllocation", "disaggsdk/kv/pools/rank_pool.py")
    assert problem_of("messages.Heartbeat", "disaggsdk/launch/health.py") == []


def test_prose_names_only_disaggsdk_modules():
    source = ROOT / "docs" / "page.md"
    mentions = snippet_mentions(Snippet(3, "see disaggsdk.nowhere and engine.nowhere\n", is_code=False), source)
    assert mentions == [Mention(source, 3, "module", "disaggsdk.nowhere")]


def test_markdown_and_python_snippets_keep_their_lines():
    page = "# t\n\nuse `engine.compile`\n\n```\ndisaggsdk plan x.yaml \\\n  --json\n```\n"
    snippets = named_things.markdown_snippets(page)
    assert Snippet(3, "engine.compile", is_code=True) in snippets
    assert Snippet(6, "disaggsdk plan x.yaml \\\n  --json\n", is_code=True) in snippets
    assert list(named_things._logical_lines("disaggsdk plan x \\\n  --json\nnext")) == [
        (0, "disaggsdk plan x    --json"), (2, "next")]
    source = '"""Doc naming ``launch.health``."""\n\nx = 1  # see `engine.hooks`\n'
    code = [s for s in named_things.python_snippets(source) if s.is_code]
    assert code == [Snippet(1, "launch.health", is_code=True), Snippet(3, "engine.hooks", is_code=True)]


def test_removing_a_named_module_makes_the_real_check_fail(tmp_path, monkeypatch):
    """The real docstrings name `launch.health`: in a copy of the package without it, they dangle."""
    package = tmp_path / "disaggsdk"
    shutil.copytree(ROOT / "disaggsdk", package, ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    (package / "launch" / "health.py").unlink()
    monkeypatch.setattr(named_things, "PACKAGE_DIR", package)
    monkeypatch.setattr(named_things, "ROOT", tmp_path)
    named_things._module_tree.cache_clear()
    try:
        problems = dangling([package / "launch" / "unit_process" / "unit.py"])
        # the copy has no built extension either, as a clean checkout: its file is named by the build
        unbuilt = named_things.path_problem("disaggsdk/transfer/_fabric*.so", ROOT / "docs" / "install.md")
    finally:
        named_things._module_tree.cache_clear()
    assert any("launch.health" in line for line in problems), problems
    assert not list(package.rglob("*.so")) and unbuilt is None
