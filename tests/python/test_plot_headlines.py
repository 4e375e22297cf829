# bench/plot_headlines.py reads the benchmarks' printed output: here the tables that
# docs/performance.md shows as the benchmarks printed them, whose ratios the README's
# performance table quotes. Parsing only: matplotlib is not needed.
import importlib.util
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("plot_headlines", ROOT / "bench" / "plot_headlines.py")
plot_headlines = importlib.util.module_from_spec(spec)
spec.loader.exec_module(plot_headlines)


@pytest.fixture(scope="module")
def headlines():
    page = (ROOT / "docs" / "performance.md").read_text()
    found = plot_headlines.parse_log("docs/performance.md", plot_headlines.page_outputs(page))
    return {label: value for _, label, value, _ in found}


def test_the_gpu_step_table_gives_each_speedup_over_torch(headlines):
    assert headlines["(b) 1516 fp32 shards vs torch fused AdamW"] == pytest.approx(1.44)
    assert headlines["(c) same shards, DTensors vs torch fused AdamW (DTensor)"] == pytest.approx(13.95)
    assert headlines["(e) 1516 shards, L2 clip vs torch clip_grad_norm_ + fused AdamW"] == pytest.approx(3.88)


def test_the_gpu_step_table_gives_each_share_of_the_copy_bandwidth(headlines):
    assert headlines["(b) 1516 fp32 shards (GPU)"] == pytest.approx(0.969)
    assert headlines["(d) bf16 + fp32 master (GPU)"] == pytest.approx(0.939)


def test_the_clip_bench_gives_its_two_gpu_speedup(headlines):
    assert headlines["clipped step over 2 GPUs vs clip_grad_norm_ + fused AdamW"] == pytest.approx(27.62)


def test_the_cpu_step_table_gives_the_ratio_to_memcpy_and_a_later_table_wins(headlines):
    assert headlines["CPU fp32"] == pytest.approx(1.41)  # of the second table (2026-12-03), not 1.31
    assert headlines["CPU fp8 e4m3, current scaling"] == pytest.approx(1.10)


def test_a_log_without_a_known_table_gives_nothing():
    assert plot_headlines.parse_log("x.log", "config elements\n(b) 1516 fp32 shards: shardadam 1 2 3\n") == []
