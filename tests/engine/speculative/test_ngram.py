"""n-gram (prompt lookup) drafting."""

from disaggsdk.engine.speculative.ngram import propose_ngram


def test_proposes_what_followed_the_latest_earlier_occurrence_of_the_longest_suffix():
    tokens = [1, 2, 3, 9, 1, 2, 3, 7, 8, 5, 2, 3]
    # suffix [2, 3] occurred at 1 and 5; the latest (5) was followed by 7, 8, 5
    assert propose_ngram(tokens, 3, 1, 4) == [7, 8, 5]
    # a longer suffix wins over a more recent shorter one: [5, 1, 2] matches where [2] alone would too
    assert propose_ngram([5, 1, 2, 4, 6, 2, 0, 5, 1, 2], 2, 1, 3) == [4, 6]
    assert propose_ngram(tokens, 1, 1, 4) == [7]


def test_no_match_no_drafts_and_never_the_suffix_itself():
    assert propose_ngram([1, 2, 3, 4], 3, 1, 4) == []
    assert propose_ngram([7], 3, 1, 4) == []
    assert propose_ngram([1, 2], 0, 1, 4) == []
    # the only occurrence of [4] is the suffix: nothing earlier to copy from
    assert propose_ngram([1, 2, 3, 4], 2, 1, 1) == []
    # a run: the earlier occurrence may overlap the suffix, and the proposal runs into it
    assert propose_ngram([6, 6, 6], 4, 1, 2) == [6]
    # min_n above every match length: nothing
    assert propose_ngram([1, 2, 9, 1, 2], 2, 3, 4) == []
