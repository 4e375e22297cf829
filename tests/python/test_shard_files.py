# tests/python/test_shard_files.py — shard files are safetensors files: the real safetensors
# package (PyPI) opens every file shardadam writes, returns tensors equal to the optimizer's
# own state views (8-bit and float8 moments as uint8 / float8_e4m3fn codes and a float32
# absmax per block), and the __metadata__ reads as docs/shard-files.md documents it.
# Everything here is computed independently of shardadam: the CRC-32C, the header
# checksum recipe, the torch.chunk boxes and the coverage count.
import json
import shutil
import subprocess

import ml_dtypes
import numpy as np
import pytest
from safetensors import SafetensorError, safe_open
from safetensors.numpy import load_file, save_file

MESHES = ("fsdp", "hsdp")
MOMENTS = ("exp_avg", "exp_avg_sq", "max_exp_avg_sq")
STATE_KEYS = {*MOMENTS, "master", "remainder"}
SCALE_KEYS = {m + "_absmax" for m in MOMENTS}  # a block moment's float32 absmax per block
BLOCK = 256
NUMPY_DTYPES = {"F32": np.float32, "BF16": ml_dtypes.bfloat16, "I16": np.int16, "U8": np.uint8,
                "F8_E4M3": ml_dtypes.float8_e4m3fn}


def _crc32c_table():
    table = []
    for b in range(256):
        crc = b
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
        table.append(crc)
    return table


CRC_TABLE = _crc32c_table()


def crc32c(data):
    crc = 0xFFFFFFFF
    for byte in data:
        crc = (crc >> 8) ^ CRC_TABLE[(crc ^ byte) & 0xFF]
    return crc ^ 0xFFFFFFFF


def test_crc32c_reference():
    assert crc32c(b"123456789") == 0xE3069283


def manifest(shard_dir, mesh):
    return json.loads((shard_dir / mesh / "manifest.json").read_text())


def files(shard_dir, mesh):
    m = manifest(shard_dir, mesh)
    return [(shard_dir / mesh / rank["file"], rank) for rank in m["ranks"]]


def raw_header(path):
    data = path.read_bytes()
    n = int.from_bytes(data[:8], "little")
    return data, n, json.loads(data[8:8 + n])


def chunk(n, parts, index):
    """torch.chunk: chunks of ceil(n / parts), trailing ones smaller or empty."""
    size = -(-n // parts)
    begin = min(index * size, n)
    return begin, min(begin + size, n) - begin


def expected_box(global_shape, mesh_shape, coord, placements):
    offset, shape = [0] * len(global_shape), list(global_shape)
    for m, placement in enumerate(placements):
        if placement is None:
            continue
        begin, size = chunk(shape[placement], mesh_shape[m], coord[m])
        offset[placement] += begin
        shape[placement] = size
    return offset, shape


PLACEMENTS = {"fsdp": [0], "hsdp": [None, 0]}  # Shard dims per mesh dim; None = Replicate


@pytest.mark.parametrize("mesh", MESHES)
def test_safe_open_reads_every_tensor_as_the_optimizer_holds_it(shard_dir, mesh):
    for path, rank in files(shard_dir, mesh):
        # Only replica 0 of a Replicate mesh dim writes state (HSDP: coordinate 0 on dim 0).
        writes = mesh != "hsdp" or rank["mesh_coord"][0] == 0
        with safe_open(str(path), framework="numpy") as f:
            keys = set(f.keys())
            assert keys == (set(rank["states"]) if writes else set()), path
            for name in keys:
                want = rank["states"][name]
                got = f.get_tensor(name)
                assert got.dtype == NUMPY_DTYPES[want["dtype"]], name
                assert list(got.shape) == want["shape"], name
                assert got.tobytes() == bytes.fromhex(want["hex"]), name
        # The whole-file loader agrees.
        loaded = load_file(str(path))
        assert set(loaded) == keys


def test_block_moments_are_their_codes_and_a_float32_absmax_per_block(shard_dir):
    # The 8-bit param's moments are uint8 codes, the float8 one's float8_e4m3fn codes
    # (amsgrad's max_exp_avg_sq too), each with its scales; the other params have none.
    seen = {}
    for path, _ in files(shard_dir, "fsdp"):
        with safe_open(str(path), framework="numpy") as f:
            for name in f.keys():
                seen.setdefault(name, set()).add(f.get_tensor(name).dtype)
    for key in ("exp_avg", "exp_avg_sq"):
        assert seen[f"q8/{key}"] == {np.dtype(np.uint8)}
        assert seen[f"q8/{key}_absmax"] == {np.dtype(np.float32)}
    for key in MOMENTS:
        assert seen[f"fp8.amsgrad/{key}"] == {np.dtype(ml_dtypes.float8_e4m3fn)}
        assert seen[f"fp8.amsgrad/{key}_absmax"] == {np.dtype(np.float32)}
    assert "q8/max_exp_avg_sq" not in seen
    assert {name for name in seen if name.endswith("_absmax")} == {
        f"q8/{k}_absmax" for k in ("exp_avg", "exp_avg_sq")} | {f"fp8.amsgrad/{k}_absmax" for k in MOMENTS}


@pytest.mark.parametrize("mesh", MESHES)
def test_metadata_is_as_documented(shard_dir, mesh):
    m = manifest(shard_dir, mesh)
    for path, rank in files(shard_dir, mesh):
        data, n, header = raw_header(path)
        assert (8 + n) % 8 == 0, "the data section starts 8-byte aligned"
        with safe_open(str(path), framework="numpy") as f:
            meta = f.metadata()
            tensors_by_name = {name: f.get_tensor(name) for name in f.keys()}
        assert meta == header["__metadata__"]
        assert meta["format"] == "shardadam"
        assert meta["format_version"] == "4"

        # header_crc32c: CRC-32C of the compact, key-sorted JSON of the metadata without
        # header_crc32c, plus each tensor's dtype and shape.
        canonical = {"__metadata__": {k: v for k, v in meta.items() if k != "header_crc32c"}}
        for name, entry in header.items():
            if name != "__metadata__":
                canonical[name] = {"dtype": entry["dtype"], "shape": entry["shape"]}
        text = json.dumps(canonical, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        assert meta["header_crc32c"] == f"{crc32c(text.encode()):08x}"

        checksum = json.loads(meta["checksum"])
        assert checksum == {"algorithm": "crc32c", "block_bytes": 1 << 20}

        groups = json.loads(meta["groups"])
        assert groups == m["groups"]  # every rank writes the groups, steps included
        assert [g["step"] for g in groups] == [3, 3]
        # Version 4: each group says its update rule (0: AdamW) and holds Muon's fields.
        assert [g["update_rule"] for g in groups] == [0, 0]
        assert all({"momentum", "nesterov", "ns_a", "ns_b", "ns_c", "ns_steps", "adjust_lr"} <= set(g)
                   for g in groups)

        writer = json.loads(meta["writer"])
        assert writer["library"].startswith("shardadam ")
        assert writer["meshes"] == [{"shape": m["mesh_shape"], "coord": rank["mesh_coord"]}]

        described = json.loads(meta["tensors"])
        assert set(described) == set(tensors_by_name)
        # params: every param the file holds tensors of, with its own step count (here all
        # stepped at every step: the groups' count).
        params = json.loads(meta["params"])
        assert set(params) == {name.rsplit("/", 1)[0] for name in described}
        assert all(entry == {"step": 3} for entry in params.values())
        for name, entry in described.items():
            param, key = name.rsplit("/", 1)
            raw = tensors_by_name[name].tobytes()
            block = checksum["block_bytes"]
            assert entry["crc32c"] == [crc32c(raw[i:i + block]) for i in range(0, len(raw), block)], name
            if key in SCALE_KEYS:
                # Block scales: no box of their own; one per block of their moment's codes.
                assert set(entry) == {"block_elems", "crc32c"}, name
                assert entry["block_elems"] == BLOCK
                codes = tensors_by_name[f"{param}/{key[:-len('_absmax')]}"]
                assert codes.dtype in (np.uint8, ml_dtypes.float8_e4m3fn), name
                assert tensors_by_name[name].dtype == np.float32
                assert tensors_by_name[name].shape == (-(-codes.size // BLOCK),), name
                continue
            assert key in STATE_KEYS
            shape = list(tensors_by_name[name].shape)
            offset, want_shape = expected_box(entry["global_shape"], m["mesh_shape"], rank["mesh_coord"],
                                              PLACEMENTS[mesh])
            assert entry["global_offset"] == offset, name
            assert want_shape == shape, name


@pytest.mark.parametrize("mesh", MESHES)
def test_the_files_cover_every_global_tensor_exactly_once(shard_dir, mesh):
    counts = {}
    for path, _ in files(shard_dir, mesh):
        with safe_open(str(path), framework="numpy") as f:
            described = json.loads(f.metadata()["tensors"])
            for name in f.keys():
                entry = described[name]
                if "block_elems" in entry:
                    continue  # block scales: their moment's box
                c = counts.setdefault(name, np.zeros(entry["global_shape"], dtype=np.int32))
                index = tuple(slice(o, o + s) for o, s in zip(entry["global_offset"], f.get_tensor(name).shape))
                c[index] += 1
    assert counts, "no tensors at all"
    for name, c in counts.items():
        assert np.all(c == 1), name


def run_inspect(tool, paths, *flags):
    return subprocess.run([tool, *flags, *map(str, paths)], capture_output=True, text=True)


@pytest.mark.parametrize("mesh", MESHES)
def test_inspect_cli_says_whole_sets_are_whole(shard_dir, inspect_tool, mesh):
    paths = [p for p, _ in files(shard_dir, mesh)]
    r = run_inspect(inspect_tool, paths)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "OK: every file is sound" in r.stdout
    assert "covered exactly once" in r.stdout
    assert "q8/exp_avg: global shape [9, 70], U8 codes, F32 absmax per 256 in exp_avg_absmax" in r.stdout
    report = json.loads(run_inspect(inspect_tool, paths, "--json").stdout)
    assert report["ok"] is True
    assert all(t["coverage"] == "exact" for t in report["tensors"])
    # Block scales go with their codes' entry, not as global tensors of their own.
    names = {t["name"] for t in report["tensors"]}
    assert not any(name.endswith("_absmax") for name in names)
    scales = {t["name"]: t["block_scales"] for t in report["tensors"] if "block_scales" in t}
    assert scales["fp8.amsgrad/max_exp_avg_sq"] == {"key": "max_exp_avg_sq_absmax", "block_elems": 256}
    assert set(scales) == {"q8/exp_avg", "q8/exp_avg_sq", "fp8.amsgrad/exp_avg", "fp8.amsgrad/exp_avg_sq",
                           "fp8.amsgrad/max_exp_avg_sq"}


def test_inspect_cli_finds_gaps_corruption_and_foreign_files(shard_dir, inspect_tool, tmp_path):
    paths = [p for p, _ in files(shard_dir, "fsdp")]
    # A missing rank: a gap.
    r = run_inspect(inspect_tool, paths[:2])
    assert r.returncode == 1
    assert "NOT WHOLE (gap)" in r.stdout and "is in no saved box" in r.stdout
    # A flipped data byte: bad checksums (headers alone do not see it).
    bad = tmp_path / "rank0.safetensors"
    data = bytearray(paths[0].read_bytes())
    data[-3] ^= 0x10
    bad.write_bytes(bytes(data))
    r = run_inspect(inspect_tool, [bad, *paths[1:]])
    assert r.returncode == 1 and "checksums bad" in r.stdout
    assert run_inspect(inspect_tool, [bad, *paths[1:]], "--headers-only").returncode == 0
    # A plain safetensors file.
    plain = tmp_path / "plain.safetensors"
    save_file({"w": np.ones((2, 3), dtype=np.float32)}, str(plain))
    r = run_inspect(inspect_tool, [plain])
    assert r.returncode == 1 and "not a shardadam shard file" in r.stdout
    # Not a file at all.
    assert run_inspect(inspect_tool, [tmp_path / "missing.safetensors"]).returncode == 2


def test_a_file_rewritten_by_safetensors_stays_a_valid_shard_file(shard_dir, inspect_tool, tmp_path):
    # save_file orders tensors its own way and spells the JSON its own way; the header
    # checksum covers the meaning, not the bytes, so the rewritten set is still whole.
    paths = [p for p, _ in files(shard_dir, "fsdp")]
    rewritten = tmp_path / "rank1.safetensors"
    with safe_open(str(paths[1]), framework="numpy") as f:
        tensors = {name: f.get_tensor(name) for name in f.keys()}
        meta = f.metadata()
    save_file(tensors, str(rewritten), metadata=meta)
    assert rewritten.read_bytes() != paths[1].read_bytes()
    r = run_inspect(inspect_tool, [paths[0], rewritten, paths[2]])
    assert r.returncode == 0, r.stdout + r.stderr
    # Changing the meaning without resealing is caught.
    meta_changed = dict(meta, groups=meta["groups"].replace('"step":3', '"step":4', 1))
    assert meta_changed != meta
    save_file(tensors, str(rewritten), metadata=meta_changed)
    r = run_inspect(inspect_tool, [paths[0], rewritten, paths[2]])
    assert r.returncode == 1 and "header checksum does not match" in r.stdout
    shutil.rmtree(tmp_path, ignore_errors=True)


@pytest.mark.parametrize("mesh", MESHES)
def test_bytes_after_the_data_section_are_refused_by_safetensors_and_by_shardadam(shard_dir, inspect_tool,
                                                                                  tmp_path, mesh):
    # The safetensors package refuses a file its tensors do not cover to the end; shardadam
    # refuses it too (it is not a file shardadam or safetensors wrote), for any count of
    # extra bytes, and for an HSDP replica's file that holds no tensor at all.
    rng = np.random.default_rng(11)
    paths = [p for p, _ in files(shard_dir, mesh)]
    for path in (paths[0], paths[-1]):
        for extra in (1, 8, 1000):
            longer = tmp_path / path.name
            longer.write_bytes(path.read_bytes() + rng.integers(0, 256, extra, dtype=np.uint8).tobytes())
            with pytest.raises(SafetensorError, match="not fully covered"):
                with safe_open(str(longer), framework="numpy") as f:
                    f.keys()
            r = run_inspect(inspect_tool, [longer])
            assert r.returncode == 1, r.stdout + r.stderr
            assert "header BAD" in r.stdout and f"{extra} bytes after the data section" in r.stdout, r.stdout
            report = json.loads(run_inspect(inspect_tool, [longer], "--json").stdout)
            assert report["ok"] is False and report["files"][0]["header"] == "bad"
