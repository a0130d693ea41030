"""Ray's temp folder names: short folders pass through, long ones go through a short alias."""

from __future__ import annotations

from pathlib import Path

import pytest

from recallserve.deployments import _ray_paths
from recallserve.deployments._ray_paths import MAX_TEMP_DIR_BYTES, ray_temp_dir, ray_temp_dir_names


def test_the_limit_leaves_room_for_rays_longest_socket() -> None:
    suffix = "/session_2026-12-02_23-00-20_308980_4194304/sockets/plasma_store"  # pid_max is 4194304
    assert MAX_TEMP_DIR_BYTES + len(suffix) == 107


def test_a_short_folder_is_given_to_ray_as_it_is(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir("/tmp")
    assert ray_temp_dir_names(Path("rs-short")) == (Path("/tmp/rs-short"),)
    assert ray_temp_dir_names(Path("/tmp/" + "y" * 38)) == (Path("/tmp/" + "y" * 38),)  # exactly 43 bytes
    assert len(ray_temp_dir_names(Path("/tmp/" + "y" * 39))) == 2


def test_a_long_folder_gets_a_short_alias_that_points_at_it(tmp_path: Path) -> None:
    deep = tmp_path / ("deep-checkout-" * 4) / ".recallserve" / "ray"
    name = ray_temp_dir(deep)
    assert deep.is_dir()
    assert len(str(name)) <= MAX_TEMP_DIR_BYTES
    assert name.is_symlink() and name.resolve() == deep.resolve()
    assert ray_temp_dir(deep) == name  # the same alias on the next start
    assert ray_temp_dir_names(deep) == (deep.resolve(), name)
    (name / "marker").write_text("x")
    assert (deep / "marker").read_text() == "x"  # Ray's files land in the configured folder
    name.unlink()


def test_an_alias_taken_by_something_else_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_ray_paths, "_ALIAS_ROOT", tmp_path)
    deep = tmp_path / ("x" * 60)
    alias = ray_temp_dir_names(deep)[1]
    alias.mkdir()  # a real folder, not a link to `deep`
    with pytest.raises(ValueError, match="ray.temp_dir: .* is too long .* taken by something else"):
        ray_temp_dir(deep)
