"""The group hyperparameters as the library defines them (``sa_group_config_field``):
names, defaults, valid values and docs, read once at import, so that this package never
retypes them. What is Python's own is two naming rules: torch spells ``beta1`` and
``beta2`` as the pair ``betas``, and an enum field's values go by name (``update_rule``
"adamw" or "muon", ``adjust_lr`` "original" or "match_rms_adamw"; their numbers are taken
too)."""
import math
import numbers

from . import _shardadam as _C
from ._errors import InvalidArgument, check


def _read_fields():
    fields = []
    for index in range(_C.sa_group_config_num_fields()):
        status, info = _C.sa_group_config_field(index)
        check(status)
        fields.append(info)
    return tuple(fields)


#: Every field of sa_group_config, in struct order: dicts with name, type (``SA_FIELD_*``),
#: default, min, max, max_inclusive, fixed_with_params, rule (words), doc and rules (the
#: update rules that read it: a bit ``1 << SA_RULE_*`` each).
FIELDS = _read_fields()
_BY_NAME = {f["name"]: f for f in FIELDS}

# The names of the enum fields' values, Python's spelling of the C enums (sa_update_rule,
# sa_muon_lr_adjust).
_ENUMS = {
    "update_rule": {"adamw": _C.SA_RULE_ADAMW, "muon": _C.SA_RULE_MUON},
    "adjust_lr": {"original": _C.SA_MUON_LR_ORIGINAL, "match_rms_adamw": _C.SA_MUON_LR_MATCH_RMS_ADAMW},
}
_ENUM_NAMES = {key: {number: name for name, number in names.items()} for key, names in _ENUMS.items()}

# torch's pairs: one Python key for several C fields.
_PAIRS = {"betas": ("beta1", "beta2")}
_PAIRED = {name: key for key, names in _PAIRS.items() for name in names}


def _python_keys():
    keys = []
    for f in FIELDS:
        key = _PAIRED.get(f["name"], f["name"])
        if key not in keys:
            keys.append(key)
    return tuple(keys)


#: The hyperparameter keys of a group, in struct order, as Python spells them ("betas").
KEYS = _python_keys()


def is_flag(name):
    """Whether a C field holds 0 or 1 (a Python bool)."""
    return _BY_NAME[name]["type"] == _C.SA_FIELD_FLAG


def is_integer(name):
    """Whether a C field holds an int32 other than a flag (an enum or a count: a Python int)."""
    return _BY_NAME[name]["type"] == _C.SA_FIELD_INT32


def _value(field, raw):
    if field["type"] == _C.SA_FIELD_FLAG:
        return bool(raw)
    if field["name"] in _ENUM_NAMES:
        return _ENUM_NAMES[field["name"]].get(int(raw), int(raw))
    return int(raw) if field["type"] == _C.SA_FIELD_INT32 else raw



def to_python(config):
    """The hyperparameters of an ``sa_group_config`` as a dict of Python keys."""
    out = {}
    for key in KEYS:
        names = _PAIRS.get(key)
        if names:
            out[key] = tuple(_value(_BY_NAME[n], getattr(config, n)) for n in names)
        else:
            out[key] = _value(_BY_NAME[key], getattr(config, key))
    return out


def coerce(key, value):
    """A Python-keyed hyperparameter in the type the library stores it as: a tuple of floats
    for a pair (betas), a bool for a flag, the name of an enum's value (given its name or
    number), an int for a count (a whole number only), else a float. Range checks are the
    library's."""
    names = _PAIRS.get(key)
    if names:
        values = tuple(float(v) for v in value)
        if len(values) != len(names):
            raise TypeError(f"{key} must be {len(names)} numbers ({', '.join(names)}), got {value!r}")
        return values
    if is_integer(key):
        # An enum or a count: a name, or a number an int32 holds exactly (the library then
        # checks its range); anything else is refused here in the library's words.
        names = _ENUMS.get(key, {})
        if isinstance(value, str) and value in names:
            return value
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value) or \
                value != int(value) or not -2**31 <= value < 2**31:
            also = f" (or its name: {', '.join(map(repr, names))})" if names else ""
            raise InvalidArgument(f"{key} is {value!r}; it must be {_BY_NAME[key]['rule']}{also}")
        value = int(value)
        return _ENUM_NAMES[key].get(value, value) if key in _ENUMS else value
    return bool(value) if is_flag(key) else float(value)


def fill(config, hyperparameters):
    """Writes Python-keyed hyperparameters into an ``sa_group_config``; an unknown key is a
    TypeError (the library validates the values)."""
    unknown = set(hyperparameters) - set(KEYS)
    if unknown:
        raise TypeError(f"unknown hyperparameters {sorted(unknown)}; known: {', '.join(KEYS)}")
    for key, value in hyperparameters.items():
        value = coerce(key, value)
        names = _PAIRS.get(key)
        if names:
            for name, v in zip(names, value):
                setattr(config, name, v)
        elif isinstance(value, str):  # an enum's value by name
            setattr(config, key, _ENUMS[key][value])
        else:
            setattr(config, key, int(value) if is_flag(key) else value)
    return config


def default_config():
    """A new ``sa_group_config`` holding the library's defaults (``sa_group_config_default``)."""
    config = _C.sa_group_config()
    check(_C.sa_group_config_default(config))
    return config


def defaults():
    """The library's default hyperparameters (torch.optim.AdamW's) as a dict of Python keys."""
    return to_python(default_config())


def doc(key):
    """One line on a Python key: the library's doc, default and valid values."""
    names = _PAIRS.get(key, (key,))
    parts = []
    for name in names:
        f = _BY_NAME[name]
        default = _value(f, f["default"])
        parts.append(f"{name}: {f['doc']} (default {default!r}; {f['rule']}"
                     + ("; fixed once the group holds a param" if f["fixed_with_params"] else "") + ")")
    return "; ".join(parts)


def fixed_keys():
    """Python keys of the fields that cannot change once a group holds a param."""
    return tuple(_PAIRED.get(f["name"], f["name"]) for f in FIELDS if f["fixed_with_params"])
