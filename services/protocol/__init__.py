"""meshrl's batch type: ``DataProto`` with verl's API (``from services.protocol import DataProto``).

Modules: ``dataproto`` (the class), ``dataproto_rows`` (repeat/unfold/iterate methods),
``dataproto_convert`` (TensorDict/pickle/disk conversions, size and info methods),
``padding`` (pad/unpad/fold), ``column_dicts`` (dict unions), ``serialization`` (tensor <->
bytes), ``future`` (``DataProtoFuture``), ``distributed`` (``all_gather_data_proto``),
``config`` (``DataProtoConfig``), ``errors`` (``DataProtoError``), ``columns`` (meshrl's
``sample_id``/``policy_version`` columns), ``tensordict_utils`` (``get_tensordict``).
"""

from services.protocol.columns import POLICY_VERSION, SAMPLE_ID, UID, check_meshrl_columns, new_sample_ids, set_policy_version
from services.protocol.config import PADDING_SIZE_KEY, DataProtoConfig
from services.protocol.dataproto import DataProto, DataProtoItem, collate_fn
from services.protocol.distributed import all_gather_data_proto
from services.protocol.errors import DataProtoError
from services.protocol.future import DataProtoFuture
from services.protocol.padding import fold_batch_dim, pad_dataproto_to_divisor, unfold_batch_dim, unpad_dataproto
from services.protocol.serialization import (
    deserialize_single_tensor,
    deserialize_tensordict,
    serialize_single_tensor,
    serialize_tensordict,
)
from services.protocol.column_dicts import (
    list_of_dict_to_dict_of_list,
    numpy_dict_to_tensor_dict,
    union_numpy_dict,
    union_tensor_dict,
    union_two_dict,
)

_padding_size_key = PADDING_SIZE_KEY

__all__ = [
    "DataProto",
    "DataProtoConfig",
    "DataProtoError",
    "DataProtoFuture",
    "DataProtoItem",
    "PADDING_SIZE_KEY",
    "POLICY_VERSION",
    "SAMPLE_ID",
    "UID",
    "all_gather_data_proto",
    "check_meshrl_columns",
    "collate_fn",
    "deserialize_single_tensor",
    "deserialize_tensordict",
    "fold_batch_dim",
    "list_of_dict_to_dict_of_list",
    "new_sample_ids",
    "numpy_dict_to_tensor_dict",
    "pad_dataproto_to_divisor",
    "serialize_single_tensor",
    "serialize_tensordict",
    "set_policy_version",
    "unfold_batch_dim",
    "union_numpy_dict",
    "union_tensor_dict",
    "union_two_dict",
    "unpad_dataproto",
]
