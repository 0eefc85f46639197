"""The online loop's kept setting saved beside a run, keyed by machine, world size and loader, for the next run."""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from lightning_dataperf.autotune.online.records import Setting, SettingSpace

__all__ = ["SAVED_FILE", "ConfirmSpace", "SavedKey", "load_saved", "save_setting"]

#: The file in the logger's folder of all versions, or the trainer's ``default_root_dir`` (not the log dir: that
#: moves to a new version each run).
SAVED_FILE = "dataperf_online_setting.json"


@dataclass(frozen=True)
class SavedKey:
    """What a kept setting holds for: the machine, the job's ranks and the training loader."""

    machine: str
    """Host name, CPU count and GPU names."""
    world_size: int
    loader: str
    """Dataset type and length, batch size and collate function."""

    def text(self) -> str:
        return f"{self.machine} | world_size={self.world_size} | {self.loader}"


def load_saved(root: str | os.PathLike[str], key: SavedKey) -> tuple[Setting | None, str]:
    """The setting a previous run kept under ``key`` (``None``: none), and a note for the plan saying which."""
    path = Path(root) / SAVED_FILE
    if not path.is_file():
        return None, ""
    try:
        entries = json.loads(path.read_text(encoding="utf-8"))["entries"]
        saved = entries.get(key.text())
        setting = None if saved is None else _checked(Setting(**saved))
    # a run killed mid-write leaves a cut file: the loop starts afresh rather than stop the run
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
        return None, f"{path} could not be read ({type(error).__name__}), so the loop starts afresh"
    if setting is not None:
        return setting, f"started from the setting a previous run kept ({path}); only confirmed here"
    machines = {text.split(" | ")[0] for text in entries}
    changed = "loader or world size" if key.machine in machines else "machine"
    return None, f"{path} holds no setting for this {changed}, so the loop starts afresh"


def save_setting(root: str | os.PathLike[str], key: SavedKey, setting: Setting) -> None:
    """Writes ``setting`` under ``key`` beside the others in ``root`` (atomically: a reader sees old or new)."""
    path = Path(root) / SAVED_FILE
    entries: dict[str, dict[str, object]] = {}
    try:
        entries = dict(json.loads(path.read_text(encoding="utf-8"))["entries"])
    except (OSError, ValueError, KeyError, TypeError):
        entries = {}
    # every field, those a later release adds too (a field it lacks takes its default when read back)
    entries[key.text()] = dataclasses.asdict(setting)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    partial.write_text(json.dumps({"version": 1, "entries": entries}, indent=1), encoding="utf-8")
    os.replace(partial, path)


def _checked(setting: Setting) -> Setting:
    """``setting`` where its values could be a loader's, else ``ValueError`` (a hand-edited file)."""
    prefetch = setting.prefetch_factor
    counts = [setting.num_workers, setting.threads] + ([] if prefetch is None else [prefetch])
    if any(type(count) is not int for count in counts) or not isinstance(setting.pin_memory, bool):
        raise ValueError(f"not a loader setting: {setting}")
    if setting.num_workers < 0 or setting.threads < 1 or (prefetch is not None and prefetch < 1):
        raise ValueError(f"not a loader setting: {setting}")
    return setting


@dataclass(frozen=True)
class ConfirmSpace(SettingSpace):
    """A saved setting's only neighbour: the user's own (one trial confirms the saved one still wins)."""

    user: Setting | None = None

    def neighbours(self, at: Setting, first: Sequence[Setting] = ()) -> Iterator[Setting]:
        # the start's facts point nowhere new: the saved setting was chosen on them already
        if self.user is not None and at != self.user:
            yield self.user

    @classmethod
    def around(cls, space: SettingSpace, user: Setting) -> ConfirmSpace:
        return cls(**{field.name: getattr(space, field.name) for field in dataclasses.fields(space)}, user=user)
