"""The group hyperparameters come from the library's table (sa_group_config_field), not
from the package: their names, defaults and valid values are the library's, and they are
torch.optim.AdamW's where torch has them. References: torch's AdamW signature (when torch
is installed), the SWIG struct's members, and the library's own errors."""
import inspect
import math
import re

import numpy as np
import pytest

import shardadam
from shardadam import _schema
from shardadam import _shardadam as _C


def test_every_field_of_the_c_struct_is_in_the_table_in_struct_order():
    fields = shardadam.group_fields()
    names = [f["name"] for f in fields]
    config = _C.sa_group_config()
    members = [m for m in dir(config) if not m.startswith("_") and m not in ("struct_size", "this", "thisown")]
    assert sorted(names) == sorted(members)
    assert [f["offset"] for f in fields] == sorted(f["offset"] for f in fields)
    assert [name for name in names if name.startswith("beta")] == ["beta1", "beta2"]


def test_the_defaults_are_torch_adamw_ones():
    torch = pytest.importorskip("torch")
    signature = inspect.signature(torch.optim.AdamW.__init__).parameters
    defaults = shardadam.group_defaults()
    for key in ("lr", "betas", "eps", "weight_decay", "amsgrad", "maximize"):
        assert defaults[key] == signature[key].default, key
    assert defaults["decoupled_weight_decay"] is True and defaults["bias_correction"] is True
    opt = shardadam.Optimizer()
    assert opt.param_groups[0].config() == defaults


def test_group_keys_and_docs_are_the_tables():
    group = shardadam.Optimizer().param_groups[0]
    fields = {f["name"]: f for f in shardadam.group_fields()}
    expected = [("betas" if name.startswith("beta") else name) for name in fields]
    assert list(group.keys()) == list(dict.fromkeys(expected)) + ["step"]
    for name, f in fields.items():
        key = "betas" if name.startswith("beta") else name
        assert f["doc"] in type(group).__dict__[key].__doc__
        assert f["rule"] in type(group).__dict__[key].__doc__


@pytest.mark.parametrize("field", [f["name"] for f in shardadam.group_fields()])
def test_the_valid_values_the_table_states_are_enforced(field):
    f = next(f for f in shardadam.group_fields() if f["name"] == field)
    key = "betas" if field.startswith("beta") else field

    def value_of(v):
        if key != "betas":
            return v
        return (v, 0.999) if field == "beta1" else (0.9, v)

    group = shardadam.Optimizer().param_groups[0]
    if f["type"] == _C.SA_FIELD_FLAG:
        group.update(**{key: True})
        assert group[key] is True
        return  # a Python bool cannot be out of range
    group.update(**{key: value_of(f["min"])})
    outside = [math.nan, math.nextafter(f["min"], -math.inf)]  # (below a finite rule's min: -inf)
    if not f["max_inclusive"]:
        outside.append(f["max"])
    for bad in outside:
        with pytest.raises(shardadam.InvalidArgument, match=f"{field} is .*it must be {re.escape(f['rule'])}"):
            group.update(**{key: value_of(bad)})
    # Nothing changed (an enum's value reads back by name: update_rule 0 is "adamw").
    assert group.config()[key] == _schema.coerce(key, value_of(f["min"]))


def test_unknown_hyperparameters_are_type_errors_before_anything_exists():
    with pytest.raises(TypeError, match="unknown hyperparameters.*'dampening'"):
        shardadam.Optimizer(dampening=0.9)
    group = shardadam.Optimizer().param_groups[0]
    with pytest.raises(TypeError, match="unknown hyperparameters"):
        group.update(foreach=True)
    with pytest.raises(TypeError, match="betas must be 2 numbers"):
        group.update(betas=(0.9,))


def test_fused_adam_takes_the_library_keys_and_refuses_others():
    torch = pytest.importorskip("torch")
    from shardadam.torch import FusedAdam
    param = torch.nn.Parameter(torch.zeros(3))
    defaults = shardadam.group_defaults()
    opt = FusedAdam([param], **defaults)
    # The group holds every library key at its default, but FusedAdam's own keys (those
    # torch's AdamW groups lack: bias_correction), which a group holds once they are set.
    adamw_keys = set(torch.optim.AdamW([param]).param_groups[0])
    assert {k: opt.param_groups[0][k] for k in defaults if k in adamw_keys} == \
        {k: v for k, v in defaults.items() if k in adamw_keys}
    own = [k for k in defaults if k not in adamw_keys]
    assert own == ["bias_correction", "update_rule", "nesterov", "momentum", "ns_a", "ns_b", "ns_c", "ns_steps",
                   "adjust_lr"] and not any(k in opt.param_groups[0] for k in own)
    assert FusedAdam([param], bias_correction=False).param_groups[0]["bias_correction"] is False
    with pytest.raises(TypeError, match="unexpected keyword arguments.*'dampening'"):
        FusedAdam([param], dampening=0.9)


def test_step_args_travel_by_the_names_of_the_librarys_table():
    """The SWIG layer fills sa_step_args by name from sa_step_args_field: every name the
    table lists is accepted, and only those."""
    names = []
    for index in range(_C.sa_step_args_num_fields()):
        status, info = _C.sa_step_args_field(index)
        assert status == _C.SA_OK
        names.append(info["name"])
    assert names == ["inv_grad_scale", "found_inf", "skipped", "max_grad_norm", "norm_type", "grad_norm",
                     "host_grad_norm"]
    opt = shardadam.Optimizer()
    handle = opt._handle_or_raise()
    with pytest.raises(KeyError, match="sa_step_args has no field 'max_norm'"):
        _C.sa_optimizer_step(handle, {"max_norm": 1.0}, None)
    with pytest.raises(TypeError, match="dict of sa_step_args fields"):
        _C.sa_optimizer_step(handle, (None, None, None), None)
    # A value reaches the library: its own check of max_grad_norm refuses a negative one.
    assert _C.sa_optimizer_step(handle, {"max_grad_norm": -1.0}, None) == _C.SA_ERR_INVALID_ARGUMENT
    assert "max_grad_norm is -1" in _C.sa_optimizer_last_error(handle)
    assert _C.sa_optimizer_step(handle, {"max_grad_norm": 0.0, "norm_type": _C.SA_NORM_INF}, None) == _C.SA_OK
    opt.close()


def test_param_options_travel_by_the_names_of_the_librarys_table():
    """The SWIG layer fills sa_param_options by name from sa_struct_field, the others keeping
    the library's defaults (sa_struct_default): the table names every field of the struct,
    an unknown name is a KeyError, a value the table rules out is the library's refusal, and
    a scale capsule is the library's (renamed "used_...") only when the add succeeds."""
    import numpy as np
    kind = _C.SA_STRUCT_PARAM_OPTIONS
    fields = [_C.sa_struct_field(kind, i)[1] for i in range(_C.sa_struct_num_fields(kind))]
    assert [f["name"] for f in fields] == ["grad_dtype", "moment_dtype", "master", "scale", "amax", "scaling",
                                          "margin", "state_placement"]
    assert [f["type"] for f in fields][:3] == [_C.SA_FIELD_DTYPE, _C.SA_FIELD_DTYPE, _C.SA_FIELD_INT32]
    assert fields[0]["dtype_role"] == _C.SA_DTYPE_GRAD and fields[1]["dtype_role"] == _C.SA_DTYPE_MOMENT
    opt = shardadam.Optimizer()
    handle = opt._handle_or_raise()

    def capsule():
        return np.zeros(256, dtype=np.float32).__dlpack__(max_version=(1, 0))

    with pytest.raises(KeyError, match="sa_param_options has no field 'moments'"):
        _C.sa_optimizer_add_param(handle, "w", 0, capsule(), None, {"moments": 1})
    status, _ = _C.sa_optimizer_add_param(handle, "w", 0, capsule(), None, {"state_placement": 9})
    assert status == _C.SA_ERR_INVALID_ARGUMENT
    assert "options.state_placement is 9; it must be an sa_state_placement" in _C.sa_optimizer_last_error(handle)
    scale = np.ones(1, dtype=np.float32).__dlpack__(max_version=(1, 0))
    status, _ = _C.sa_optimizer_add_param(handle, "w", 0, capsule(), None, {"scale": scale})
    assert status == _C.SA_ERR_INVALID_ARGUMENT  # a float32 param takes no scale
    assert "options.scale is set but the param is not scaled" in _C.sa_optimizer_last_error(handle)
    assert "used_" not in repr(scale)  # refused: still the caller's
    status, index = _C.sa_optimizer_add_param(handle, "w", 0, capsule(), None,
                                              {"moment_dtype": (1, 8, 1), "margin": 0})
    assert status == _C.SA_OK
    status, info = _C.sa_optimizer_param_info(handle, index)
    assert status == _C.SA_OK and tuple(info["moment_dtype"]) == (1, 8, 1)  # uint8: the field arrived
    opt.close()


def test_add_param_takes_more_options_by_the_tables_names():
    """Optimizer.add_param(fields=...) hands sa_param_options fields by name to the library,
    which checks them as it checks the others (so an option of a newer library needs no new
    keyword); struct_fields lists every struct's fields from the library's table."""
    import numpy as np
    names = [f["name"] for f in shardadam.struct_fields("param_options")]
    assert names == ["grad_dtype", "moment_dtype", "master", "scale", "amax", "scaling", "margin", "state_placement"]
    assert [f["name"] for f in shardadam.struct_fields("optimizer_config")] == ["num_threads", "cpu_simd"]
    assert [f["name"] for f in shardadam.struct_fields("import_options")][0] == "staging_bytes"
    assert [f["name"] for f in shardadam.struct_fields("group_config")][0] == "lr"
    with pytest.raises(ValueError, match="kind must be one of"):
        shardadam.struct_fields("params")
    opt = shardadam.Optimizer()
    with pytest.raises(shardadam.InvalidArgument, match="options.margin is 7; it must be 0 to 6"):
        opt.add_param("w", np.zeros(8, dtype=np.float32), fields={"margin": 7})
    with pytest.raises(KeyError, match="sa_param_options has no field 'margins'"):
        opt.add_param("w", np.zeros(8, dtype=np.float32), fields={"margins": 1})
    assert opt.num_params == 0
    # A field given both ways takes the fields= value: the moment dtype arrives as uint8.
    index = opt.add_param("w", np.zeros(512, dtype=np.float32), moment_dtype="float32",
                          fields={"moment_dtype": (1, 8, 1)})
    assert opt.param_info(index).moment_dtype == "uint8"
    opt.close()


def test_dtype_table_matches_numpy_and_the_add_param_checks():
    """The library's dtype table (shardadam.dtypes(), read from sa_dtype) against numpy's and
    ml_dtypes' own dtypes, and its param/moment roles against what add_param accepts."""
    import ml_dtypes

    kind_codes = {"f": 2, "u": 1, "i": 0}  # numpy kinds -> dlpack.h's DLDataTypeCode
    # dlpack.h's DLDataTypeCode of each ml_dtypes dtype
    ml = {"bfloat16": (ml_dtypes.bfloat16, 4), "float8_e4m3fn": (ml_dtypes.float8_e4m3fn, 10),
          "float8_e5m2": (ml_dtypes.float8_e5m2, 12), "float8_e8m0fnu": (ml_dtypes.float8_e8m0fnu, 14)}
    table = {d["name"]: d for d in shardadam.dtypes()}
    assert set(table) == {"float32", "bfloat16", "float16", "uint8", "float8_e4m3fn", "float8_e5m2",
                          "float8_e8m0fnu", "int16"}
    for name, d in table.items():
        code, bits, lanes = d["dtype"]
        if name in ml:
            assert code == ml[name][1] and bits == np.dtype(ml[name][0]).itemsize * 8
        else:
            assert (code, bits) == (kind_codes[np.dtype(name).kind], np.dtype(name).itemsize * 8)
        assert lanes == 1
        assert d["doc"]
    # Shard files hold block moments as their codes (and a float32 absmax per block).
    assert table["uint8"]["safetensors_name"] == "U8"
    assert table["float8_e4m3fn"]["safetensors_name"] == "F8_E4M3"
    block_role = 32  # SA_DTYPE_BLOCK_MOMENT: moments of it are codes and a per-block absmax
    assert {n for n, d in table.items() if d["roles"] & block_role} == {"uint8", "float8_e4m3fn"}
    assert [table[n]["safetensors_name"] for n in ("float32", "bfloat16", "float16", "int16")] == [
        "F32", "BF16", "F16", "I16"]

    param_role, moment_role = 1, 4  # SA_DTYPE_PARAM, SA_DTYPE_MOMENT
    for name, d in table.items():
        np_dtype = ml[name][0] if name in ml else np.dtype(name)
        opt = shardadam.Optimizer()
        try:
            opt.add_param("p", np.zeros(256, np_dtype))
            added, refusal = True, None
        except (shardadam.InvalidArgument, shardadam.Unsupported) as e:
            added, refusal = False, str(e)
        # An fp8 param dtype is a param dtype that needs a scaling (sa_param_options.scaling):
        # refused without one, saying so, and taken with one.
        needs_scaling = refusal is not None and f"a {name} param needs a scaling" in refusal
        if needs_scaling:
            opt.add_param("p", np.zeros(256, np_dtype), scaling="delayed", scale=np.ones(1, np.float32))
        assert (added or needs_scaling) == bool(d["roles"] & param_role), (name, refusal)
        assert not needs_scaling or name in ("float8_e4m3fn", "float8_e5m2"), name
        # SA_DTYPE_SCALED_PARAM (FusedAdam's fp8 dtypes come from it) is what add_param says.
        assert bool(d["roles"] & _C.SA_DTYPE_SCALED_PARAM) == needs_scaling, name
        opt = shardadam.Optimizer()
        try:
            opt.add_param("p", np.zeros(300, np.float32), moment_dtype=name)
            added = True
        except (shardadam.InvalidArgument, shardadam.Unsupported):
            added = False
        assert added == bool(d["roles"] & moment_role), name
