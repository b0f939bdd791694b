"""Reading dataset sources: files by URI/glob (local or s3://), records per format, and the field
mappings a manifest names (conversation, image).

Every failure that concerns one row is returned as a reason string "kind: detail" (the row goes
to the rejects table); only a file that cannot be parsed at all raises ValueError.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import string
from typing import Annotated, Any, Literal

import pyarrow.parquet as pq
from pydantic import Field, model_validator

from jobs.lib.config import Strict
from jobs.lib.storage import Storage, StorageUnavailable, _s3_kwargs, join, scheme_of
from spec_core.reference.tasks import IMAGE_TOKEN

ERROR_KEY = "__manifest_error__"  # key of a record that could not even be parsed (a bad JSONL line)
_PLACEHOLDER = IMAGE_TOKEN.strip()
Uris = str | list[str]


class MessagesConversation(Strict):
    """A list of {role_key, content_key} mappings (LLaVA: conversations / from / value)."""

    kind: Literal["messages"]
    field: str = "conversations"
    role_key: str = "role"
    content_key: str = "content"
    roles: dict[str, Literal["user", "assistant"]] = {
        "user": "user", "assistant": "assistant", "human": "user", "gpt": "assistant"}

    def turns(self, rec: dict) -> list[dict] | str:
        raw = rec.get(self.field)
        if not isinstance(raw, list) or not raw:
            return f"empty conversation: '{self.field}' is missing, empty or not a list"
        out = []
        for i, t in enumerate(raw):
            role = self.roles.get(str(t.get(self.role_key))) if isinstance(t, dict) else None
            if role is None:
                return f"bad conversation: turn {i} has no known role in '{self.role_key}'"
            if not isinstance(t.get(self.content_key), str):
                return f"bad conversation: turn {i} has no text in '{self.content_key}'"
            out.append({"role": role, "content": t[self.content_key]})
        return out


class PromptsConversation(Strict):
    """A list of user prompts (MT-Bench / MMSpec `turns`): user turns only; the target answers."""

    kind: Literal["prompts"]
    field: str = "turns"

    def turns(self, rec: dict) -> list[dict] | str:
        raw = rec.get(self.field)
        raw = [raw] if isinstance(raw, str) else raw
        if not isinstance(raw, list) or not raw:
            return f"empty conversation: '{self.field}' is missing, empty or not a list"
        if not all(isinstance(t, str) for t in raw):
            return f"bad conversation: '{self.field}' holds something other than strings"
        return [{"role": "user", "content": t} for t in raw]


class QAConversation(Strict):
    """[context line +] question (+ lettered choices + suffix) -> one user turn; answer (if named)
    -> assistant. The layout of lmms-eval's / LLaVA's ScienceQA prompt: "Context: {hint}\n" first
    (left out when empty), then the question, "A. ..." lines and the suffix."""

    kind: Literal["qa"]
    question: str = "question"
    context: str | None = None  # e.g. ScienceQA's `hint`
    context_format: str = "Context: {context}"
    answer: str | None = None
    # An integer answer is an index into the choices (ScienceQA's `answer: 2`): `letter` -> the
    # option's letter as the prompt letters it ("C"), `text` -> the option's text, `raw` -> "2".
    # Any other answer (a letter, free text, a number when no `choices` are named) is kept as is.
    answer_format: Literal["letter", "text", "raw"] = "letter"
    choices: str | None = None  # a list (lettered A, B, ...) or a {letter: text} mapping
    choice_format: str = "{letter}. {text}"
    suffix: str = ""  # own last line, e.g. "Answer with the option's letter from the given choices directly."

    @model_validator(mode="after")
    def _index_needs_choices(self) -> QAConversation:
        if self.choices is None and "answer_format" in self.model_fields_set and self.answer_format != "raw":
            raise ValueError(f"answer_format '{self.answer_format}' maps an answer index into the "
                             "choices: name the 'choices' field too")
        return self

    def _options(self, rec: dict) -> list[tuple[str, Any]] | str:
        opts = rec.get(self.choices) if self.choices else None
        if isinstance(opts, dict):
            return list(opts.items())
        if not isinstance(opts, list):
            return []
        if len(opts) > len(string.ascii_uppercase):
            return f"bad conversation: {len(opts)} choices in '{self.choices}', more than the letters A-Z"
        return list(zip(string.ascii_uppercase, opts))

    def turns(self, rec: dict) -> list[dict] | str:
        q = rec.get(self.question)
        if not isinstance(q, str) or not q.strip():
            return f"empty conversation: no question in '{self.question}'"
        ctx = rec.get(self.context) if self.context else None
        if ctx is not None and not isinstance(ctx, str):
            return f"bad conversation: '{self.context}' holds something other than text"
        options = self._options(rec)
        if isinstance(options, str):
            return options
        lines = [self.context_format.format(context=ctx)] if ctx and ctx.strip() else []
        lines += [q] + [self.choice_format.format(letter=k, text=v) for k, v in options]
        if self.suffix:
            lines.append(self.suffix)
        out = [{"role": "user", "content": "\n".join(lines)}]
        ans = rec.get(self.answer) if self.answer else None
        ans = (ans[0] if ans else None) if isinstance(ans, list) else ans
        if ans is None:
            return out
        if isinstance(ans, int) and not isinstance(ans, bool) and self.choices and self.answer_format != "raw":
            if not 0 <= ans < len(options):
                return (f"bad answer: index {ans} in '{self.answer}' is out of range of the "
                        f"{len(options)} choices in '{self.choices}'")
            ans = options[ans][0 if self.answer_format == "letter" else 1]
        out.append({"role": "assistant", "content": str(ans)})
        return out

    def fields(self) -> set[str]:
        return {f for f in (self.question, self.context, self.answer, self.choices) if f}


Conversation = Annotated[MessagesConversation | PromptsConversation | QAConversation,
                         Field(discriminator="kind")]


def conversation_fields(conv: Conversation) -> set[str]:
    return conv.fields() if isinstance(conv, QAConversation) else {conv.field}


def with_image_token(turns: list[dict]) -> list[dict] | str:
    """Placeholders removed wherever the source put them, then "<image>\\n" opens the first turn
    (the reference world's convention)."""
    if turns[0]["role"] != "user":
        return "bad conversation: it does not start with a user turn"
    out = [{"role": t["role"], "content": t["content"].replace(IMAGE_TOKEN, "")
            .replace("\n" + _PLACEHOLDER, "").replace(_PLACEHOLDER, "")} for t in turns]
    out[0]["content"] = IMAGE_TOKEN + out[0]["content"]
    return out


class ImageSpec(Strict):
    """The image column: a path/URI string (relative ones under `root`), raw bytes, or an HF Image
    struct {bytes, path}. Kept as the source has it: a reference stays a URI, bytes stay bytes."""

    field: str = "image"
    root: str | None = None  # any storage URI


def has_image(value: Any) -> bool:
    if isinstance(value, dict):
        return bool(value.get("bytes") or value.get("path"))
    return bool(value)


def read_image(value: Any, spec: ImageSpec, store: Storage) -> tuple[str | None, bytes | None, str] | str:
    """(image_uri, image_bytes, sha256 of the bytes) - exactly one of the first two set - or the
    reason the image cannot be used. The file is always read: the hash is of its bytes."""
    from PIL import Image

    if isinstance(value, dict):  # an HF Image struct
        value = value.get("bytes") or value.get("path")
    uri = None
    if isinstance(value, (bytes, bytearray)) and value:
        data = bytes(value)
    elif isinstance(value, str) and value:
        uri = value if spec.root is None or "://" in value or os.path.isabs(value) else join(spec.root, value)
        if scheme_of(uri) == "file" and "://" not in uri:
            uri = os.path.abspath(uri)  # a manifest must not depend on the builder's cwd
        try:
            data = store.read_bytes(uri)
        except FileNotFoundError:
            return f"image not found: {uri}"
        except StorageUnavailable:
            raise  # the build's, not the row's
        except OSError as err:
            return f"image unreadable: {uri}: {err}"
    else:
        return f"no image: nothing usable in '{spec.field}'"
    try:
        with Image.open(io.BytesIO(data)) as im:
            im.verify()
    except Exception as err:  # Pillow raises many kinds for a corrupt file
        return f"image unreadable: {uri or 'embedded bytes'}: {type(err).__name__}: {err}"
    return uri, None if uri else data, hashlib.sha256(data).hexdigest()


def expand_uris(store: Storage, uris: Uris) -> list[str]:
    """Files of one or more URIs/globs, each glob sorted; a pattern matching nothing is an error."""
    out = []
    for uri in [uris] if isinstance(uris, str) else uris:
        fs, path = store.fs(uri)
        if not any(c in path for c in "*?["):
            found = [uri] if fs.exists(path) else []
        else:
            prefix = uri[: len(uri) - len(path)] if "://" in uri else ""
            found = [prefix + p for p in sorted(fs.glob(path))]
        if not found:
            raise ValueError(f"no file matches '{uri}'")
        out += found
    return out


def read_hf_disk(uri: str, store: Storage, cols: set[str], split: str | None = None) -> list[dict]:
    """A `Dataset.save_to_disk` folder, or the split `split` of a `DatasetDict.save_to_disk`
    folder, read by `datasets.load_from_disk` -> its rows with only the columns `cols`. Nothing
    is decoded: an Image column stays {bytes, path} structs. No hub access and no cache file: the
    folder is memory-mapped (a remote one is first copied whole to datasets' temporary directory,
    removed at exit), and the only transforms (column selection, Arrow format) write nothing."""
    import datasets

    dict_json = join(uri, datasets.config.DATASETDICT_JSON_FILENAME)
    if store.exists(dict_json):  # load the one split asked for, not every split of the folder
        splits = json.loads(store.read_text(dict_json))["splits"]
        if split is None:
            raise ValueError(f"{uri} holds a DatasetDict (splits {', '.join(splits)}): point 'uri' at one "
                             f"split's folder ({join(uri, splits[0])}) or use a per-split 'uri' mapping "
                             "whose keys are its split names")
        if split not in splits:
            raise ValueError(f"{uri} holds a DatasetDict without a split '{split}' "
                             f"(it has {', '.join(splits)}): rename the per-split 'uri' key")
        uri = join(uri, split)
    opts = _s3_kwargs(store.cfg) if scheme_of(uri) == "s3" else None
    try:
        ds = datasets.load_from_disk(uri, keep_in_memory=False, storage_options=opts)
    except FileNotFoundError as err:
        raise ValueError(f"{uri} is not a folder written by datasets' save_to_disk: {err}") from None
    names = [c for c in ds.column_names if c in cols]
    if not names:  # an Arrow table without columns has no rows either
        return [{} for _ in range(ds.num_rows)]
    return ds.select_columns(names).with_format("arrow")[:].to_pylist()


def read_file(fmt: str, uri: str, store: Storage, cols: set[str], split: str | None = None) -> list[dict]:
    """One file -> its records in file order, with only the columns `cols`; `split` names the
    split of a DatasetDict folder (hf_disk). A JSON(L) item that is not an object becomes an error
    record; a file that cannot be parsed at all is a ValueError.

    Parquet (Hub-style exports included: plain Parquet plus `huggingface` schema metadata) is read
    with pyarrow rather than `datasets.load_dataset("parquet")`, which would first write an Arrow
    copy of every column into its cache; pyarrow reads only the mapped columns, in place, through
    the same filesystem as everything else, and an Image column arrives as the same {bytes, path}
    struct."""
    if fmt == "parquet":
        fs, path = store.arrow_fs(uri)
        names = [c for c in pq.read_schema(path, filesystem=fs).names if c in cols]
        return pq.read_table(path, filesystem=fs, columns=names).to_pylist()
    if fmt == "hf_disk":
        return read_hf_disk(uri, store, cols, split)
    text = store.read_text(uri)
    if fmt == "json":
        try:
            items = json.loads(text)
        except json.JSONDecodeError as err:
            raise ValueError(f"{uri} is not valid JSON: {err}") from None
        if not isinstance(items, list):
            raise ValueError(f"{uri} must hold a JSON list of samples")
        numbered = list(enumerate(items))
    else:
        numbered = []
        for i, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    numbered.append((i, json.loads(line)))
                except json.JSONDecodeError as err:
                    numbered.append((i, {ERROR_KEY: f"invalid record: line {i} is not JSON ({err.msg})"}))
    return [{k: x[k] for k in cols | {ERROR_KEY} if k in x} if isinstance(x, dict)
            else {ERROR_KEY: f"invalid record: item {i} is not a JSON object"} for i, x in numbered]
