"""expand_paths: unreadable subdirectories and symlink loops are errors naming them, never skipped."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from collapse_doctor.core.errors import InputError
from collapse_doctor.io.discovery import discover_runs
from collapse_doctor.io.storage.paths import expand_paths
from tests.helpers.runs import binary_run


def _kind(path: Path) -> str | None:
    return "parquet" if path.suffix == ".parquet" else None


def _empty(text: str, inside: list[Path]) -> InputError:
    return InputError(f"{text}: empty")


def _expand(*paths: str | Path) -> list[Path]:
    return [p for _, p in expand_paths(list(paths), kind_of=_kind, empty_directory=_empty).files]


def test_files_below_a_directory_as_rglob_found_them(tmp_path: Path) -> None:
    (tmp_path / "a" / "b").mkdir(parents=True)
    for name in ("a/x.parquet", "a/b/y.parquet", "z.parquet", "a/notes.txt"):
        (tmp_path / name).write_bytes(b"")
    (tmp_path / "linked").symlink_to(tmp_path / "a")  # symlinked directories are not followed (as rglob)
    (tmp_path / "dangling.parquet").symlink_to(tmp_path / "gone.parquet")  # not a file: skipped, as before
    found = _expand(tmp_path)
    assert found == sorted(p for p in tmp_path.rglob("*") if p.is_file() and p.suffix == ".parquet")
    assert [p.relative_to(tmp_path).as_posix() for p in found] == ["a/b/y.parquet", "a/x.parquet", "z.parquet"]


def test_an_unreadable_subdirectory_is_an_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Tests run as root, for whom a chmod 000 directory stays readable: the listing's failure is simulated where
    # the walk lists directories (os.scandir), as the kernel reports it to a normal user.
    run = tmp_path / "run"
    (run / "locked").mkdir(parents=True)
    binary_run(run / "part-0.parquet", pass_rates={"a": 0.5}, steps=4)
    binary_run(run / "locked" / "part-1.parquet", pass_rates={"a": 0.5}, steps=4)
    real_scandir = os.scandir

    def scandir(path: str | os.PathLike[str]) -> object:
        if Path(path).name == "locked":
            raise PermissionError(13, "Permission denied", str(path))
        return real_scandir(path)

    monkeypatch.setattr(os, "scandir", scandir)
    with pytest.raises(InputError) as caught:
        discover_runs([run])
    assert caught.value.one_line().startswith(f"{run / 'locked'}: cannot read this directory (Permission denied)")
    assert "fix its permissions" in caught.value.one_line()


def test_a_symlink_loop_has_its_own_error(tmp_path: Path) -> None:
    (tmp_path / "a.parquet").symlink_to(tmp_path / "b.parquet")
    (tmp_path / "b.parquet").symlink_to(tmp_path / "a.parquet")
    with pytest.raises(InputError) as caught:
        _expand(tmp_path / "a.parquet")
    assert (
        caught.value.message
        == f"{tmp_path / 'a.parquet'}: symbolic link loop (the link resolves to itself through other links)"
    )
    with pytest.raises(InputError, match="symbolic link loop"):
        _expand(tmp_path)  # found inside a directory: named too, not skipped
    with pytest.raises(InputError, match="no such file or directory"):
        _expand(tmp_path / "missing.parquet")  # a plain missing path keeps its message


def _two_runs(root: Path) -> None:
    for name, seed in (("a", 0), ("b", 1)):
        (root / "runs" / name).mkdir(parents=True)
        binary_run(root / "runs" / name / "rollouts.parquet", pass_rates={"x": 0.5}, steps=4, seed=seed)


def test_a_glob_across_run_dirs_is_a_sweep_of_those_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Expected from the rule (docs/usage.md): a glob's files are grouped as a directory's are, by where they lie,
    # so two run dirs' files are two runs (not one run whose groups hold both runs' completions), and a glob that
    # matches the run dirs themselves is the same sweep.
    _two_runs(tmp_path)
    (tmp_path / "runs" / "notes.txt").write_text("not a run")  # beside matched directories: ignored, as in one
    monkeypatch.chdir(tmp_path)
    for pattern in ("runs/*/rollouts.parquet", "runs/*", "runs/*/"):
        runs = discover_runs([pattern])
        assert [r.name for r in runs] == ["a", "b"], pattern
        assert [[p.as_posix() for p in r.rollout_files] for r in runs] == [
            ["runs/a/rollouts.parquet"],
            ["runs/b/rollouts.parquet"],
        ], pattern


def test_a_glob_that_matches_nothing_says_so(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="pattern matches no file or directory"):
        discover_runs([str(tmp_path / "runs" / "*")])


def test_an_empty_argument_is_not_the_working_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    binary_run(tmp_path / "run.parquet", pass_rates={"x": 0.5}, steps=4)  # "" must not find this run
    for empty in ("", "  "):
        with pytest.raises(InputError, match="an empty path"):
            discover_runs([empty])
