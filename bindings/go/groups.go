package shardadam

import (
	"sort"
	"strings"
	"sync"

	"github.com/shardadam/shardadam/bindings/go/internal/capi"
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

// FieldInfo describes one group hyperparameter as the library defines it (sa_field_info).
type FieldInfo struct {
	Name string // its key in GroupConfig and in shard files
	Flag bool   // true: 0 or 1; false: a float64
	// Default is its value in a new group (torch.optim.AdamW's where torch has the field).
	Default float64
	// Valid values v: Min <= v, and v < Max, or v <= Max when MaxInclusive (a Max of +Inf,
	// exclusive, means "finite").
	Min, Max     float64
	MaxInclusive bool
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
	errbuf := make([]byte, errorBufferBytes)
	fields := make([]FieldInfo, capi.Sa_group_config_num_fields())
	for i := range fields {
		values, info := make([]float64, 3), make([]int64, 4)
		var text []byte
		for { // the first call says how many bytes the strings need, the second copies them
			if err := resultError(capi.Sago_group_field(i, values, info, text, errbuf), errbuf); err != nil {
				panic("shardadam: reading the library's group field table: " + err.Error())
			}
			if int64(len(text)) >= info[3] {
				break
			}
			text = make([]byte, info[3])
		}
		strs := strings.Split(string(text[:info[3]]), "\x00") // name, rule, doc and ""
		fields[i] = FieldInfo{Name: strs[0], Flag: info[0] != 0, Default: values[0],
			Min: values[1], Max: values[2], MaxInclusive: info[1] != 0,
			FixedWithParams: info[2] != 0, Rule: strs[1], Doc: strs[2]}
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

// packFields lays cfg out for the C helpers: its names in sorted order (so that the
// library, which reports the first bad field, says the same for the same config every
// time) and their values.
func packFields(op string, cfg GroupConfig) (names []byte, values []float64, err error) {
	keys := make([]string, 0, len(cfg))
	for name := range cfg {
		keys = append(keys, name)
	}
	sort.Strings(keys)
	if names, err = packStrings(op, "field name", keys); err != nil {
		return nil, nil, err
	}
	values = make([]float64, len(keys))
	for i, name := range keys {
		values[i] = cfg[name]
	}
	return names, values, nil
}

// AddGroup appends a group with the library's defaults but for the fields cfg names, and
// returns its index (0, 1, ...). Groups are positional: create the same groups in the
// same order on every rank. cfg may be nil (all defaults).
func (o *Optimizer) AddGroup(cfg GroupConfig) (int, error) {
	const op = "shardadam.AddGroup"
	names, values, err := packFields(op, cfg)
	if err != nil {
		return -1, err
	}
	if err := o.lock(op); err != nil {
		return -1, err
	}
	defer o.mu.Unlock()
	group := []int{-1}
	if err := resultError(capi.Sago_add_group_fields(o.handle, names, values, group, o.errbuf), o.errbuf); err != nil {
		return -1, err
	}
	return group[0], nil
}

// Group returns every hyperparameter of a group, one entry per field of GroupFields.
func (o *Optimizer) Group(group int) (GroupConfig, error) {
	fields := GroupFields()
	keys := make([]string, len(fields))
	for i, f := range fields {
		keys[i] = f.Name
	}
	names, err := packStrings("shardadam.Group", "field name", keys)
	if err != nil {
		return nil, err
	}
	if err := o.lock("shardadam.Group"); err != nil {
		return nil, err
	}
	defer o.mu.Unlock()
	values := make([]float64, len(keys))
	if err := resultError(capi.Sago_get_group_fields(o.handle, group, names, values, o.errbuf), o.errbuf); err != nil {
		return nil, err
	}
	cfg := make(GroupConfig, len(keys))
	for i, name := range keys {
		cfg[name] = values[i]
	}
	return cfg, nil
}

// SetGroup replaces the fields of a group that cfg names and keeps the others (all checked
// first; nothing changes on error). A field with FieldInfo.FixedWithParams cannot change
// once the group holds a param.
func (o *Optimizer) SetGroup(group int, cfg GroupConfig) error {
	const op = "shardadam.SetGroup"
	names, values, err := packFields(op, cfg)
	if err != nil {
		return err
	}
	if err := o.lock(op); err != nil {
		return err
	}
	defer o.mu.Unlock()
	return resultError(capi.Sago_set_group_fields(o.handle, group, names, values, o.errbuf), o.errbuf)
}

// SetLR sets the learning rate of a group (what an LR schedule changes each step).
func (o *Optimizer) SetLR(group int, lr float64) error {
	if err := o.lock("shardadam.SetLR"); err != nil {
		return err
	}
	defer o.mu.Unlock()
	return resultError(capi.Sago_set_lr(o.handle, group, lr, o.errbuf), o.errbuf)
}

// StepCount returns a group's step count: the steps taken and not skipped.
func (o *Optimizer) StepCount(group int) (int64, error) {
	if err := o.lock("shardadam.StepCount"); err != nil {
		return 0, err
	}
	defer o.mu.Unlock()
	step := []int64{0}
	if err := resultError(capi.Sago_get_step(o.handle, group, step, o.errbuf), o.errbuf); err != nil {
		return 0, err
	}
	return step[0], nil
}

// SetStepCount sets a group's step count and those of its params (e.g. when resuming).
func (o *Optimizer) SetStepCount(group int, step int64) error {
	if err := o.lock("shardadam.SetStepCount"); err != nil {
		return err
	}
	defer o.mu.Unlock()
	return resultError(capi.Sago_set_step(o.handle, group, step, o.errbuf), o.errbuf)
}
