"""meshrl's sample_id / policy_version columns."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from services.protocol import DataProto, DataProtoError
from services.protocol.columns import check_meshrl_columns, new_sample_ids, set_policy_version


def test_new_ids_are_unique_strings_and_survive_repeat():
    ids = new_sample_ids(5, prefix="job1-")
    assert ids.dtype == object and len(set(ids.tolist())) == 5 and all(i.startswith("job1-") for i in ids)
    d = DataProto.from_dict({"obs": torch.arange(5)}, {"sample_id": ids})
    set_policy_version(d, 4)
    check_meshrl_columns(d, policy_version=True)
    assert d.batch["policy_version"].tolist() == [4] * 5 and d.batch["policy_version"].dtype == torch.int64
    with pytest.raises(DataProtoError, match="unique"):
        check_meshrl_columns(d.repeat(2))  # repeated rows need fresh sample ids


def test_bad_columns_are_named():
    d = DataProto.from_dict({"obs": torch.arange(2)})
    with pytest.raises(DataProtoError, match="missing non-tensor column 'sample_id'"):
        check_meshrl_columns(d)
    check_meshrl_columns(d, sample_id=False)
    with pytest.raises(DataProtoError, match="missing tensor column 'policy_version'"):
        check_meshrl_columns(d, sample_id=False, policy_version=True)
    d.batch["policy_version"] = torch.zeros(2, dtype=torch.int32)
    with pytest.raises(DataProtoError, match="int64"):
        check_meshrl_columns(d, sample_id=False)
    e = DataProto.from_dict(non_tensors={"sample_id": np.array(["a", 3], dtype=object)})
    with pytest.raises(DataProtoError, match="non-empty str"):
        check_meshrl_columns(e)
