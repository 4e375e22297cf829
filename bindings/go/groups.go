package shardadam

// #include <shardadam/shardadam.h>
import "C"

import (
	"sort"
	"sync"
	"unsafe"
)

// The group hyperparameters are the library's: their names, defaults, valid values and
// docs come from its field table (sa_group_config_field) and travel by name
// (sa_optimizer_*_group_fields), so a field the library adds reaches Go users with no
// change here.

// GroupConfig holds hyperparameters of a param group by the library's field names (those
// GroupFields lists, such as "lr"); a flag is 0 or 1. shardadam.h has the update formula.
// A config need not name every field: AddGroup takes the defaults, and SetGroup keeps the
// group's values, for the fields it leaves out. The library checks the names and the
// values: an unknown name is a StatusInvalidArgument whose message lists the known ones.
type GroupConfig map[string]float64

// The update rules a group may have (its "update_rule" field: sa_update_rule), and their
// bits in FieldInfo.Rules.
const (
	RuleAdamW = C.SA_RULE_ADAMW // Adam / AdamW, the default
	RuleMuon  = C.SA_RULE_MUON  // Muon: 2-D matrices, float32 or bfloat16 with a float32 master (shardadam.h)
)

// FieldInfo describes one group hyperparameter as the library defines it (sa_field_info).
type FieldInfo struct {
	Name    string // its key in GroupConfig and in shard files
	Flag    bool   // true: 0 or 1
	Integer bool   // true: an integer (a flag, an enum such as update_rule, or a count)
	// Rules: the update rules that read it, a bit per rule (RuleAdamW, RuleMuon).
	Rules int32
	// Default is its value in a new group (torch.optim.AdamW's where torch has the field).
	Default float64
	// Valid values v: Min <= v, and v < Max, or v <= Max when MaxInclusive (a Max of +Inf,
	// exclusive, means "finite").
	Min, Max     float64
	MaxInclusive bool // Max itself is valid
	// FixedWithParams: it cannot change once the group holds a param (StatusState), as the
	// params' state was allocated by it.
	FixedWithParams bool
	Rule            string // the valid values in the words of the library's errors
	Doc             string // what the field does
}

var groupFields struct {
	once   sync.Once
	fields []FieldInfo
}

// GroupFields returns every group hyperparameter of the loaded library, in the order of
// sa_group_config's members (the table is read once).
func GroupFields() []FieldInfo {
	groupFields.once.Do(func() { groupFields.fields = readGroupFields() })
	return append([]FieldInfo(nil), groupFields.fields...)
}

// readGroupFields reads the library's field table. It cannot fail for the indices the
// library itself counts, so a failure is a broken library: a panic with its message.
func readGroupFields() []FieldInfo {
	fields := make([]FieldInfo, C.sa_group_config_num_fields())
	for i := range fields {
		f := C.sa_field_info{struct_size: C.sizeof_sa_field_info}
		if err := handleless(func() C.sa_status { return C.sa_group_config_field(C.int32_t(i), &f) }); err != nil {
			panic("shardadam: reading the library's group field table: " + err.Error())
		}
		fields[i] = FieldInfo{Name: C.GoString(f.name), Flag: f._type == C.SA_FIELD_FLAG,
			Integer: f._type == C.SA_FIELD_FLAG || f._type == C.SA_FIELD_INT32, Rules: int32(f.rules),
			Default: float64(f.default_value), Min: float64(f.min), Max: float64(f.max),
			MaxInclusive: f.max_inclusive != 0, FixedWithParams: f.fixed_with_params != 0,
			Rule: C.GoString(f.rule), Doc: C.GoString(f.doc)}
	}
	return fields
}

// DefaultGroupConfig returns every field at the library's default (SA_GROUP_CONFIG_INIT,
// torch.optim.AdamW's defaults), as GroupFields lists them. The map is the caller's to
// change.
func DefaultGroupConfig() GroupConfig {
	cfg := GroupConfig{}
	for _, f := range GroupFields() {
		cfg[f.Name] = f.Default
	}
	return cfg
}

// packFields lays cfg out as sa_optimizer_*_group_fields take it, in C memory: its names
// in sorted order (so that the library, which reports the first bad field, says the same
// for the same config every time) and their values.
func packFields(op string, mem *cArena, cfg GroupConfig) (names **C.char, values *C.double, n C.int32_t, err error) {
	keys := make([]string, 0, len(cfg))
	for name := range cfg {
		keys = append(keys, name)
	}
	sort.Strings(keys)
	if names, values, err = cFields(op, mem, keys); err != nil {
		return nil, nil, 0, err
	}
	for i, name := range keys {
		unsafe.Slice(values, len(keys))[i] = C.double(cfg[name])
	}
	return names, values, C.int32_t(len(keys)), err
}

// cFields copies field names into C memory, with room for one value each.
func cFields(op string, mem *cArena, keys []string) (**C.char, *C.double, error) {
	if len(keys) == 0 {
		return nil, nil, nil
	}
	names := unsafe.Slice((**C.char)(mem.alloc(uintptr(len(keys))*unsafe.Sizeof((*C.char)(nil)))), len(keys))
	for i, name := range keys {
		if err := checkNoNUL(op, "field name", name); err != nil {
			return nil, nil, err
		}
		names[i] = mem.str(name)
	}
	return &names[0], (*C.double)(mem.alloc(uintptr(len(keys)) * 8)), nil
}

// AddGroup appends a group with the library's defaults but for the fields cfg names, and
// returns its index (0, 1, ...). Groups are positional: create the same groups in the
// same order on every rank. cfg may be nil (all defaults).
func (o *Optimizer) AddGroup(cfg GroupConfig) (int, error) {
	const op = "shardadam.AddGroup"
	var mem cArena
	defer mem.free()
	names, values, n, err := packFields(op, &mem, cfg)
	if err != nil {
		return -1, err
	}
	if err := o.lock(op); err != nil {
		return -1, err
	}
	defer o.mu.Unlock()
	group := C.int32_t(-1)
	if err := o.check(C.sa_optimizer_add_group_fields(o.handle, n, names, values, &group)); err != nil {
		return -1, err
	}
	return int(group), nil
}

// Group returns every hyperparameter of a group, one entry per field of GroupFields.
func (o *Optimizer) Group(group int) (GroupConfig, error) {
	fields := GroupFields()
	keys := make([]string, len(fields))
	for i, f := range fields {
		keys[i] = f.Name
	}
	var mem cArena
	defer mem.free()
	names, values, err := cFields("shardadam.Group", &mem, keys)
	if err != nil {
		return nil, err
	}
	if err := o.lock("shardadam.Group"); err != nil {
		return nil, err
	}
	defer o.mu.Unlock()
	if err := o.check(C.sa_optimizer_get_group_fields(o.handle, C.int32_t(group), C.int32_t(len(keys)), names, values)); err != nil {
		return nil, err
	}
	cfg := make(GroupConfig, len(keys))
	for i, name := range keys {
		cfg[name] = float64(unsafe.Slice(values, len(keys))[i])
	}
	return cfg, nil
}

// SetGroup replaces the fields of a group that cfg names and keeps the others (all checked
// first; nothing changes on error). A field with FieldInfo.FixedWithParams cannot change
// once the group holds a param.
func (o *Optimizer) SetGroup(group int, cfg GroupConfig) error {
	const op = "shardadam.SetGroup"
	var mem cArena
	defer mem.free()
	names, values, n, err := packFields(op, &mem, cfg)
	if err != nil {
		return err
	}
	if err := o.lock(op); err != nil {
		return err
	}
	defer o.mu.Unlock()
	return o.check(C.sa_optimizer_set_group_fields(o.handle, C.int32_t(group), n, names, values))
}

// SetLR sets the learning rate of a group (what an LR schedule changes each step).
func (o *Optimizer) SetLR(group int, lr float64) error {
	if err := o.lock("shardadam.SetLR"); err != nil {
		return err
	}
	defer o.mu.Unlock()
	return o.check(C.sa_optimizer_set_lr(o.handle, C.int32_t(group), C.double(lr)))
}

// StepCount returns a group's step count: the steps taken and not skipped.
func (o *Optimizer) StepCount(group int) (int64, error) {
	if err := o.lock("shardadam.StepCount"); err != nil {
		return 0, err
	}
	defer o.mu.Unlock()
	var step C.int64_t
	if err := o.check(C.sa_optimizer_get_step(o.handle, C.int32_t(group), &step)); err != nil {
		return 0, err
	}
	return int64(step), nil
}

// SetStepCount sets a group's step count and those of its params (e.g. when resuming).
func (o *Optimizer) SetStepCount(group int, step int64) error {
	if err := o.lock("shardadam.SetStepCount"); err != nil {
		return err
	}
	defer o.mu.Unlock()
	return o.check(C.sa_optimizer_set_step(o.handle, C.int32_t(group), C.int64_t(step)))
}
