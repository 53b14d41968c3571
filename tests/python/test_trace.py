"""The trace loader (fluxon/trace.py): the public Mooncake trace loads whole and its infinite-cache
ceiling is the one its release states; every kind of malformed line is refused by line and field."""

from pathlib import Path

import pytest

from fluxon.trace import BLOCK_TOKENS, TraceError, load_trace, prefix_ceiling

PUBLIC = Path(__file__).resolve().parents[2] / "traces" / "mooncake_fast25_conversation.jsonl"


def test_the_public_trace_loads_whole_and_its_prefix_ceiling_is_the_published_one():
    reqs = load_trace(PUBLIC)
    c = prefix_ceiling(reqs)
    # The figures of the trace's README (measured independently of this code).
    assert c["requests"] == 12031 and c["block_refs"] == 288500 and c["distinct_blocks"] == 182790
    assert round(c["ceiling_refs_pct"], 1) == 36.6 and round(c["ceiling_tokens_pct"], 1) == 37.4
    first = load_trace(PUBLIC, max_requests=100)
    assert [r.line for r in first] == list(range(1, 101)) and first == reqs[:100]
    assert sum(r.block_tokens(i) for r in reqs for i in range(len(r.hash_ids))) == sum(r.input_length for r in reqs)


@pytest.mark.parametrize("line, field", [
    ('{"timestamp": 2, "input_length": 10, "output_length": 1, "hash_ids": [1]', "not JSON"),
    ('[1, 2]', "expected a JSON object"),
    ('{"input_length": 10, "output_length": 1, "hash_ids": [1]}', "'timestamp' is missing"),
    ('{"timestamp": 2, "input_length": -3, "output_length": 1, "hash_ids": [1]}', "'input_length' must be at least 1"),
    ('{"timestamp": 2, "input_length": 10, "output_length": -1, "hash_ids": [1]}', "'output_length' must be at least 0"),
    ('{"timestamp": 2, "input_length": "10", "output_length": 1, "hash_ids": [1]}', "'input_length' must be an integer"),
    ('{"timestamp": 2, "input_length": 10, "output_length": 1}', "'hash_ids' is missing"),
    ('{"timestamp": 2, "input_length": 10, "output_length": 1, "hash_ids": [1, "x"]}', "'hash_ids' must be a list"),
    ('{"timestamp": 2, "input_length": 600, "output_length": 1, "hash_ids": [1]}', "1 blocks for input_length 600"),
    ('{"timestamp": 2, "input_length": 512, "output_length": 1, "hash_ids": [1, 2]}', "2 blocks for input_length 512"),
    ('{"timestamp": 1, "input_length": 10, "output_length": 1, "hash_ids": [1]}', "goes back in time (1 after 2)"),
    ('', "an empty line"),
])
def test_a_malformed_line_is_refused_with_its_number_and_field(tmp_path, line, field):
    good = '{"timestamp": 2, "input_length": %d, "output_length": 3, "hash_ids": [4, 5]}' % (BLOCK_TOKENS + 1)
    p = tmp_path / "t.jsonl"
    p.write_text(good + "\n" + line + "\n")
    with pytest.raises(TraceError) as e:
        load_trace(p)
    assert f"{p}:2:" in str(e.value) and field in str(e.value), str(e.value)
    assert len(load_trace(p, max_requests=1)) == 1  # the first line alone is fine
