"""What a run resumes from (`choose`: damaged checkpoints, a history left behind renamed aside), the `best` it keeps,
its tokenizer (`run_tokenizer`), its --set values (`run_config`) and what resuming changes (`differences`)."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from typing import Any, NamedTuple

import yaml

from bertcli import __version__, checkpoint, console, layout, store
from bertcli.config import PATH_KEYS, Config, changes_line, flat, to_dict
from bertcli.config_load import MAX_CONFIG_BYTES, config_from_dict, load_yaml
from bertcli.config_write import Dumper
from bertcli.errors import BertcliError, RunError, UsageError

# What a change of setting means when a run resumes, by key prefix; others (paths, devices, precision...) go unsaid.
# "global batch": examples a step over all processes, compared instead of its split where recorded.
EXAMPLE_SETTINGS = ["train.seed", "global batch", "train.batch_size", "data"]
NOT_EXAMPLES = ("data.tokenizer", "data.prepared_dir")
HELD_OUT_SETTINGS = ["train.seed", "data", "train.eval_examples", "eval"]  # eval: the probe's data (its figures only)
UPDATE_SETTINGS = ["optimizer", "train.max_steps", "train.mlm_weight", "train.nsp_weight", "train.max_grad_norm"]
Batches = tuple[int | None, int] | None  # a step's examples over all processes (then, now), where recorded

# Why a run set a checkpoint aside, by the prefix of its new name.
SET_ASIDE = {
    layout.ABANDONED_PREFIX: "of a history left behind when the run resumed from an earlier checkpoint (or another run's)",
    layout.DAMAGED_PREFIX: "found damaged when the run resumed",
}
SETTINGS_HEADER = "# The settings this run trains with"  # the first line of layout.RUN_SETTINGS, as bertcli writes it
SET_LINE = "# --set: "  # then the --set values it keeps, as JSON


def _never_refused(folder: Path, count: int) -> UsageError:
    return UsageError(f"{folder} has {count} checkpoint(s) (--resume never): use --resume auto or a new output_dir")


class Resume(NamedTuple):
    """The checkpoint to resume from (None: start fresh) and the held-out loss of the `best` kept."""

    path: Path | None
    best: float | None


def is_foreign(ckpt: Path | None, output_dir: Path) -> bool:
    """Whether checkpoint `ckpt` is not a folder of output_dir's checkpoints/ (another run's, or a copy)."""
    return ckpt is not None and Path(ckpt).resolve().parent != layout.checkpoints_dir(output_dir).resolve()


def choose(cfg: Config, resume: str, *, is_main: bool, last_step: int, tokenizer: bytes | None) -> Resume:
    """The checkpoint to resume from per `resume` (auto, never, a path), refused where of another model or tokenizer."""
    output_dir, path, done = Path(cfg.output_dir), None, False
    if resume == "never" and (found := layout.list_checkpoints(output_dir)):
        raise _never_refused(layout.checkpoints_dir(output_dir), len(found))
    if resume == "auto":
        path = _choose_auto(output_dir, is_main)
    elif resume != "never":
        path = _choose_path(Path(resume), output_dir, is_main, last_step)
    if path is not None:
        check_same_model(path, cfg)
        if tokenizer is not None:
            check_same_tokenizer(path, Path(cfg.data.prepared_dir) / layout.TOKENIZER_JSON, tokenizer)
        done = checkpoint.read_trainer_state(path)["step"] >= last_step  # nothing to do: best caught up only
    best = layout.checkpoints_dir(output_dir) / layout.BEST
    loss = _best_loss(best, cfg) if done else settle_best(cfg, path, is_main)
    return Resume(path, catch_up_best(cfg, path, loss, is_main))


def _best_loss(best: Path, cfg: Config) -> float | None:
    return checkpoint.best_loss(best, cfg.checkpoint.best_metric) if layout.is_checkpoint(best) else None


def _choose_auto(output_dir: Path, is_main: bool) -> Path | None:
    """The newest checkpoint that verifies (`best` where newer); newer damaged or incomplete ones are set aside."""
    found, root = layout.list_checkpoints(output_dir), layout.checkpoints_dir(output_dir)
    damaged, chosen, good = [], None, -1
    for step, candidate in reversed(found):
        if not (problems := checkpoint.verify(candidate)):
            chosen, good = candidate, step
            break
        damaged.append((candidate, f"{problems[0][0]}: {problems[0][1]}"))
    best = root / layout.BEST
    if damaged and layout.is_checkpoint(best) and not best.is_symlink() and not checkpoint.verify(best):
        step = checkpoint.read_trainer_state(best).get("step")
        chosen = best if isinstance(step, int) and good < step <= found[-1][0] else chosen
    if found and chosen is None:
        newest, why = damaged[0]
        raise RunError(f"{root}: no checkpoint loads ({newest.name}: {why}); set output_dir to a new folder")
    partial = [(s, p) for s, p in layout.list_step_folders(output_dir) if s > good and not layout.is_checkpoint(p)]
    damaged += [(p, layout.incomplete(p)) for _, p in reversed(partial)]
    for bad, reason in damaged if is_main else []:
        aside = _rename_aside(bad, layout.DAMAGED_PREFIX)
        then = f"resuming from the newest checkpoint that loads, {chosen}" if chosen else "starting fresh"
        console.log(f"{bad} is damaged ({reason}): renamed {aside.name}; {then}")
    return chosen


def _choose_path(path: Path, output_dir: Path, is_main: bool, last_step: int) -> Path:
    """--resume PATH; the run's checkpoints past it (all, for another run's) renamed aside where there is work."""
    check_not_set_aside(path, output_dir)
    if problem := layout.incomplete(path):
        raise UsageError(f"--resume {path}: {problem}")
    checkpoint.check_links(path)
    if problems := checkpoint.verify(path):
        raise checkpoint.damaged_state(f"{path} is damaged ({problems[0][0]}: {problems[0][1]})")
    step, foreign = checkpoint.read_trainer_state(path)["step"], is_foreign(path, output_dir)
    here = path.resolve()
    later = [(p, s) for s, p in layout.list_checkpoints(output_dir) if (foreign or s > step) and p.resolve() != here]
    for other, at in later if is_main and step < last_step else []:
        aside = _rename_aside(other, layout.ABANDONED_PREFIX)
        why = f"past the step resumed from ({step})" if at > step else f"the run resumes from {path}, another folder"
        console.log(f"{other} is of step {at}, {why}: a history left behind, renamed {aside.name}")
    return path


def check_not_set_aside(path: Path, output_dir: Path) -> None:
    """Refuse resuming a checkpoint its own run set aside: the run's history would splice two."""
    if Path(path).name.startswith(tuple(SET_ASIDE)) and not is_foreign(path, output_dir):
        raise UsageError(f"--resume {path}: a checkpoint this run set aside, of another history: use a new output_dir")


def set_aside_note(path: Path) -> str | None:
    """What encode, export and init say of a checkpoint its run set aside (None: another folder)."""
    why = next((why for prefix, why in SET_ASIDE.items() if Path(path).name.startswith(prefix)), None)
    return why and f"{path} is a checkpoint its run set aside, {why}; the run's own checkpoints are its step-* folders"


def _rename_aside(folder: Path, prefix: str) -> Path:
    aside = folder.with_name(f"{prefix}{folder.name}")
    if aside.exists():
        aside = aside.with_name(f"{aside.name}.{time.strftime('%Y%m%d-%H%M%S')}")
    os.replace(folder, aside)
    return aside


def settle_best(cfg: Config, resumed: Path | None, is_main: bool) -> float | None:
    """The loss of the `best` kept (None: none); one of another model or history is removed (or renamed aside)."""
    output_dir = Path(cfg.output_dir)
    best = layout.checkpoints_dir(output_dir) / layout.BEST
    loss, reason = _best_loss(best, cfg), None
    if not best.exists() or (resumed is not None and Path(resumed) == best):
        return loss
    if resumed is None:
        reason = "this run starts fresh, so it was of another run"
    elif is_foreign(resumed, output_dir):
        reason = f"this run resumes from a checkpoint outside its checkpoints folder, {resumed}"
    else:
        try:
            checkpoint.check_links(best)
            step, at = checkpoint.read_trainer_state(best)["step"], checkpoint.read_trainer_state(resumed)["step"]
            diffs = model_differences(checkpoint.read_config(best), cfg)
        except (BertcliError, OSError, KeyError, TypeError):
            loss, diffs = None, None
        if diffs is None:
            reason = "it is damaged (its config or trainer state does not load)"
        elif diffs:
            reason = f"it is of another model ({diffs[0]})"
        elif step > at:
            reason = f"it is of step {step}, past the step resumed from ({at}): a history left behind"
    if reason is None:
        return loss
    if cfg.model.init_from and store.relation(best, Path(cfg.model.init_from)) is not None:
        return None  # the weights this run starts from: left in place, replaced at the next best
    if is_main and not best.is_symlink() and store.not_owned(best, layout.CHECKPOINT) is None:
        if loss is None or _step_kept(best):
            store.remove_folder(best)
            console.log(f"removed {best}: {reason}")
        else:  # the only copy of those weights
            aside = _rename_aside(best, layout.ABANDONED_PREFIX)
            console.log(f"{best}: {reason}; no step folder holds its weights, so it is renamed {aside.name}")
    return None


def _step_kept(best: Path) -> bool:
    """Whether a step folder beside `best` (kept, or set aside as abandoned) holds its step."""
    try:
        name = layout.step_dir_name(checkpoint.read_trainer_state(best)["step"])
    except (OSError, KeyError, TypeError, BertcliError):
        return False
    return any(layout.is_checkpoint(best.parent / n) for n in (name, layout.ABANDONED_PREFIX + name))


def catch_up_best(cfg: Config, resumed: Path | None, best: float | None, is_main: bool) -> float | None:
    """Copy the step resumed from to `best` where it scores better: a run stopped between the two writes left it."""
    output_dir, metric = Path(cfg.output_dir), cfg.checkpoint.best_metric
    if resumed is None or is_foreign(resumed, output_dir) or resumed.name == layout.BEST:
        return best
    loss = checkpoint.best_loss(resumed, metric)
    if loss is None or (best is not None and loss >= best):
        return best
    if is_main:
        target = layout.checkpoints_dir(output_dir) / layout.BEST
        checkpoint.guard(target)
        with store.folder(target, checkpoint.guard) as tmp:
            for name in layout.CHECKPOINT_FILES + layout.TOKENIZER_FILES:
                if (resumed / name).is_file():
                    with store.writing(tmp / name):  # (a full disk: copyfile's error names its source)
                        shutil.copyfile(resumed / name, tmp / name)
        console.log(f"wrote {target}: {resumed.name} was evaluated best ({metric} {abs(loss):.4g})")
    return loss


def run_tokenizer(cfg: Config, resume_from: Path | None = None, *, say: bool = False) -> Path | None:
    """The tokenizer.json of the run's newest intact checkpoint (the run's token ids), else of `resume_from`."""
    candidates = [p for _, p in reversed(layout.list_checkpoints(Path(cfg.output_dir)))]
    for path in candidates + ([Path(resume_from)] if resume_from else []):
        if store.own_file(path / layout.TOKENIZER_JSON) and not checkpoint.change(path):
            if say and (changed := setting_changes(checkpoint.read_config(path), cfg, ["data.tokenizer"])):
                console.log(f"warning: {changed}: ignored, as this run keeps the tokenizer of its checkpoints ({path})")
            return path / layout.TOKENIZER_JSON
    return None


def model_differences(a: Config, b: Config) -> list[str]:
    """Model fields that differ between two configs (init_from says where weights came from, not what the model is)."""
    da, db = to_dict(a)["model"], to_dict(b)["model"]
    keys = [k for k in da if da[k] != db[k] and k != "init_from"]
    return [f"model.{k}={da[k]!r} in the checkpoint vs {db[k]!r} in the config" for k in keys]


def check_same_model(path: Path, cfg: Config, *, vocab: bool = True) -> None:
    """Refuse (exit 2) resuming `path` as another model (vocab_size compared where `vocab` and set in `cfg`)."""
    diffs = model_differences(checkpoint.read_config(path), cfg)
    if cfg.model.vocab_size is None or not vocab:
        diffs = [d for d in diffs if not d.startswith("model.vocab_size=")]
    if diffs:
        raise UsageError(f"cannot resume from {path}: {'; '.join(diffs)}; start fresh in a new folder (output_dir)")


def check_same_tokenizer(ckpt: Path, source: Path, contents: bytes) -> None:
    """Refuse to resume `ckpt` on data of another tokenizer (`contents`, of file `source`): other token ids."""
    from tokenizers import Tokenizer

    from bertcli.data.tokenizer import read_tokenizer_json, tokenizer_identity

    file = ckpt / layout.TOKENIZER_JSON
    if not file.is_file():
        return  # a checkpoint of the synthetic corpus
    if file.is_symlink():
        raise store.linked(file, checkpoint.FIX)
    ours = tokenizer_identity(read_tokenizer_json(file))
    if ours != tokenizer_identity(Tokenizer.from_str(contents.decode("utf-8"))):
        raise UsageError(f"{source}: not the tokenizer of {ckpt}: set data.tokenizer.path: {file} or a new output_dir")


def setting_changes(saved: Config, cfg: Config, prefixes: list[str], batches: Batches = None) -> str:
    """Settings under `prefixes` that differ between `saved` and `cfg`, in words (the global batch, not its split)."""
    old, new = flat(saved), flat(cfg)
    old.pop("train.micro_batch_size"), new.pop("train.micro_batch_size")  # the machine's split, not the recipe's
    if batches is not None and batches[0] is not None:
        old.pop("train.batch_size"), new.pop("train.batch_size")
        old["global batch"], new["global batch"] = batches
    synthetic = old["data.corpus"] == new["data.corpus"] == "synthetic"  # its settings matter only then

    def same(key: str, a: Any, b: Any) -> bool:
        if key in PATH_KEYS and isinstance(a, str) and isinstance(b, str) and a and b:
            return os.path.realpath(a) == os.path.realpath(b)
        return a == b

    def wanted(key: str) -> bool:
        under = any(key == p or key.startswith(p + ".") for p in prefixes)
        excluded = key.startswith(NOT_EXAMPLES) and "data.tokenizer" not in prefixes
        return under and not excluded and (synthetic or not key.startswith("data.synthetic."))

    return changes_line([(k, old.get(k), new[k]) for k in new if wanted(k) and not same(k, old.get(k), new[k])])


class Overrides(NamedTuple):
    """The --set values a run trains with: `kept`, recorded by the run and not given again, then `given` now."""

    kept: list[str]
    given: list[str]


def write_settings(cfg: Config, overrides: Overrides) -> Path:
    """Record the config `cfg` of the run (resolved, whole) in its folder, with the --set values among it."""
    path = Path(cfg.output_dir) / layout.RUN_SETTINGS
    header = (
        f"{SETTINGS_HEADER} (bertcli {__version__}): defaults < {layout.RUN_CONFIG} < --set, resolved.\n"
        "# A plain `bertcli pretrain` of this run keeps the --set values below until they are given again.\n"
        f"{SET_LINE}{json.dumps(overrides.kept + overrides.given)}\n"
    )
    store.write_text(path, header + yaml.dump(to_dict(cfg), Dumper=Dumper, sort_keys=False))
    return path


def read_settings(output_dir: Path) -> tuple[list[str], Config | None]:
    """The --set values recorded in `output_dir` and its config (None: does not load); refused where not bertcli's."""
    path, fix = Path(output_dir) / layout.RUN_SETTINGS, "move it away, or set output_dir to another folder"
    if (problem := store.file_problem(path)) == "missing":
        return [], None
    if problem or path.stat().st_size > MAX_CONFIG_BYTES:
        raise UsageError(f"{path}: {problem or 'too large'}, not the file of settings bertcli writes there; {fix}")
    text = store.read_own(path, fix).decode("utf-8", errors="replace")
    lines = text.splitlines()
    try:
        recorded = json.loads(next(line[len(SET_LINE) :] for line in lines[:4] if line.startswith(SET_LINE)))
        if not text.startswith(SETTINGS_HEADER) or not all(isinstance(item, str) for item in recorded):
            raise ValueError
    except (StopIteration, ValueError, TypeError):
        raise UsageError(f"{path}: not the file of settings bertcli writes there; {fix}") from None
    try:
        return recorded, config_from_dict(load_yaml(text), str(path))
    except (UsageError, ValueError, RecursionError, yaml.YAMLError):
        return recorded, None


def kept_overrides(cfg: Config, given: list[str], resume_arg: str) -> list[str]:
    """The --set values recorded in cfg.output_dir that `given` does not give again ([] where the run starts fresh)."""
    output_dir = Path(cfg.output_dir)
    recorded = read_settings(output_dir)[0]  # (read at every start: a file not bertcli's is refused before any work)
    foreign = resume_arg not in ("auto", "never") and is_foreign(Path(resume_arg), output_dir)
    if resume_arg == "never" or foreign or not layout.list_checkpoints(output_dir):
        return []
    again = {item.partition("=")[0].strip() for item in given}
    return [item for item in recorded if item.partition("=")[0].strip() not in again]


def run_config(
    config: Path, given: list[str], resume_arg: str = "auto", *, adopt: bool = True
) -> tuple[Config, Overrides]:
    """The config a run trains with: its config file, the --set values it keeps (kept_overrides), then `given`."""
    from bertcli.resolve import from_here, load_run

    given = from_here(given)  # (recorded so: paths absolute)
    kept = kept_overrides(load_run(config, given, adopt_init_from=False), given, resume_arg)
    return load_run(config, kept + given, adopt_init_from=adopt), Overrides(kept, given)


def differences(
    saved: Config, cfg: Config, *, step: int, where: str, batches: Batches, then: Any, now: dict[str, Any] | None
) -> list[str]:
    """What resuming `where` under `cfg` changes: one line each for the examples, the held-out set, the updates."""
    from bertcli.optim import lr_at

    examples = setting_changes(saved, cfg, EXAMPLE_SETTINGS, batches)
    held_out = setting_changes(saved, cfg, HELD_OUT_SETTINGS)
    updates = setting_changes(saved, cfg, UPDATE_SETTINGS)
    text = ["data.corpus", "data.split_sentences"]
    same_text = isinstance(then, dict) and now is not None and not setting_changes(saved, cfg, text)
    lines = []
    if examples or (same_text and then.get("index") != now["index"]):
        what = f"other settings ({examples})" if examples else "a corpus whose text changed"
        if not examples:
            what += f" ({then.get('documents', '?')} documents then, {now['documents']:,} now)"
        lines.append(f"resuming {where} with {what}: steps {step + 1:,} on train on other examples")
    if cfg.train.eval_every > 0 and (held_out or (same_text and then.get("held_out") != now.get("held_out"))):
        what = f"other settings ({held_out})" if held_out else "other held-out documents"
        lines.append(f"resuming {where} with {what}: held-out metrics from now on are not comparable with earlier ones")
    if updates:
        before, after = (lr_at(step, c.optimizer, c.train.max_steps) for c in (saved, cfg))
        lr = f" (learning rate {before:.3g} -> {after:.3g} at step {step + 1:,})" if before != after else ""
        lines.append(f"resuming {where} with other settings ({updates}): steps {step + 1:,} on follow them{lr}")
    return lines


def best_of_other_set(output_dir: Path, cfg: Config, now: dict[str, Any] | None) -> bool:
    """Whether `best` was scored on other examples than the run's now (held-out text, or the probe's labeled data)."""
    best = layout.checkpoints_dir(output_dir) / layout.BEST
    try:
        then = checkpoint.read_trainer_state(best).get(checkpoint.PREPARED_DATA)
        probe = cfg.checkpoint.best_metric.startswith("probe_")  # a figure of eval.*'s labeled data, not held-out text
        other_data = (
            not probe and isinstance(then, dict) and now is not None and then.get("held_out") != now.get("held_out")
        )
        settings = [s for s in HELD_OUT_SETTINGS if s != ("train.eval_examples" if probe else "eval")]
        other_settings = bool(setting_changes(checkpoint.read_config(best), cfg, settings))
        return cfg.train.eval_every > 0 and (other_settings or other_data)
    except (BertcliError, OSError):
        return False


def check_before(cfg: Config, resume: str) -> Path | None:
    """Refuse from files alone, before torch loads, what `choose` would; the run's fixed tokenizer.json."""
    from bertcli.data.prepare import fixed_tokenizer

    output_dir = Path(cfg.output_dir)
    found, path = layout.list_checkpoints(output_dir), None
    if resume == "never" and found:
        raise _never_refused(layout.checkpoints_dir(output_dir), len(found))
    if resume not in ("auto", "never"):
        path = Path(resume)
        if problem := resume_problem(path):
            raise UsageError(f"--resume {resume}: {problem}")
        check_not_set_aside(path, output_dir)
        if change := checkpoint.change(path):
            raise checkpoint.damaged_state(f"{path} is damaged ({change[0]}: {change[1]})")
    elif resume == "auto" and found:
        path = found[-1][1]
    tokenizer = run_tokenizer(cfg, path)
    if path is not None and not checkpoint.change(path):  # (a damaged newest one: `choose` sets it aside)
        check_same_model(path, cfg, vocab=False)  # another architecture first: no tokenizer fixes it
        used = fixed_tokenizer(cfg, tokenizer)
        if used is not None and used[0] != path / layout.TOKENIZER_JSON:
            check_same_tokenizer(path, used[0], used[1].to_str().encode())
        check_same_model(path, cfg)
    return tokenizer


def resume_problem(path: Path) -> str | None:
    """Why --resume PATH names no checkpoint, and what to pass where a run or a model folder was given."""
    if (problem := layout.incomplete(path)) is None:
        return None
    found = layout.identify(path)
    if path.name == layout.CHECKPOINTS and layout.identify(path.parent).kind is layout.Kind.RUN:
        found = layout.identify(path.parent)  # a run's checkpoints/ (tab-completed): its run's answer
    if found.kind is layout.Kind.RUN and found.checkpoints:
        return f"a run folder, not a checkpoint: name one of its checkpoints ({found.checkpoints[-1][1]}, its newest)"
    if found.kind in (layout.Kind.HF, layout.Kind.SENTENCE):
        return f"{found.kind.value}, not a checkpoint: to start from its weights, set model.init_from to it"
    return problem
