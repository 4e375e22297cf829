//! The library's tables of the option structs of the C ABI (`sa_struct_field`), and option
//! structs filled by field name from them: a field this crate has no member for (a newer
//! library's) is set by the name the library gives it, at the offset the library gives.

use crate::{cstr_to_string, handleless_result, invalid, read_table, sys, Result};

/// An option struct of the C ABI whose fields the library describes (`sa_struct_kind`).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum StructKind {
    /// `sa_group_config`: a group's hyperparameters ([`crate::group_fields`] has their rules).
    GroupConfig,
    /// `sa_step_args`.
    StepArgs,
    /// `sa_optimizer_config`.
    OptimizerConfig,
    /// `sa_param_options` ([`crate::ParamOptions`]).
    ParamOptions,
    /// `sa_import_options`.
    ImportOptions,
}

impl StructKind {
    fn code(self) -> i32 {
        match self {
            StructKind::GroupConfig => sys::SA_STRUCT_GROUP_CONFIG,
            StructKind::StepArgs => sys::SA_STRUCT_STEP_ARGS,
            StructKind::OptimizerConfig => sys::SA_STRUCT_OPTIMIZER_CONFIG,
            StructKind::ParamOptions => sys::SA_STRUCT_PARAM_OPTIONS,
            StructKind::ImportOptions => sys::SA_STRUCT_IMPORT_OPTIONS,
        }
    }
}

/// How a field is stored (`sa_field_type`).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum FieldType {
    /// A `double`.
    Double,
    /// An `int32_t`, 0 or 1.
    Flag,
    /// An `int32_t` (an enum: its valid values are `[min, max]`).
    Int32,
    /// A pointer.
    Pointer,
    /// A `uint64_t`.
    Uint64,
    /// A `DLDataType` (all zero: the default).
    DType,
    /// A type this crate does not know (a newer library's).
    Other(i32),
}

impl FieldType {
    fn of(code: i32) -> FieldType {
        match code {
            sys::SA_FIELD_DOUBLE => FieldType::Double,
            sys::SA_FIELD_FLAG => FieldType::Flag,
            sys::SA_FIELD_INT32 => FieldType::Int32,
            sys::SA_FIELD_POINTER => FieldType::Pointer,
            sys::SA_FIELD_UINT64 => FieldType::Uint64,
            sys::SA_FIELD_DTYPE => FieldType::DType,
            other => FieldType::Other(other),
        }
    }

    /// The bytes of a number field, or `None` for a field that is not a number.
    fn number_width(self) -> Option<usize> {
        match self {
            FieldType::Double | FieldType::Uint64 => Some(8),
            FieldType::Flag | FieldType::Int32 => Some(4),
            _ => None,
        }
    }
}

/// One field of an option struct as the loaded library defines it (`sa_field_info`).
#[derive(Clone, Debug, PartialEq)]
pub struct StructField {
    /// The C member's name: the name [`crate::ParamOptions::fields`] sets it by.
    pub name: String,
    /// How it is stored.
    pub field_type: FieldType,
    /// `offsetof(<struct>, <name>)`.
    pub offset: usize,
    /// Its value in the struct's `SA_*_INIT` (0 for a pointer or a dtype).
    pub default: f64,
    /// Valid values v: `min <= v`, and `v < max`, or `v <= max` when `max_inclusive`.
    pub min: f64,
    /// See `min`.
    pub max: f64,
    /// `max` itself is valid.
    pub max_inclusive: bool,
    /// The valid values in the words of the library's error messages.
    pub rule: String,
    /// What the field does.
    pub doc: String,
}

/// The fields of the option struct `kind`, in struct order, as the loaded library knows
/// them (`sa_struct_num_fields`, `sa_struct_field`).
///
/// ```
/// use shardadam::{struct_fields, FieldType, StructKind};
///
/// let fields = struct_fields(StructKind::ParamOptions);
/// let margin = fields.iter().find(|f| f.name == "margin").unwrap();
/// assert_eq!(margin.field_type, FieldType::Int32);
/// ```
///
/// # Panics
///
/// If the library fails to describe a field it counts (a bug in the library).
pub fn struct_fields(kind: StructKind) -> Vec<StructField> {
    let code = kind.code();
    let n = unsafe { sys::sa_struct_num_fields(code) };
    read_table(
        n,
        "sa_struct_field",
        |index, out| unsafe { sys::sa_struct_field(code, index, out) },
        // SAFETY: on SA_OK the strings are the library's static ones (or NULL).
        |raw: &sys::sa_field_info| unsafe {
            StructField {
                name: cstr_to_string(raw.name),
                field_type: FieldType::of(raw.r#type),
                offset: raw.offset,
                default: raw.default_value,
                min: raw.min,
                max: raw.max,
                max_inclusive: raw.max_inclusive != 0,
                rule: cstr_to_string(raw.rule),
                doc: cstr_to_string(raw.doc),
            }
        },
    )
}

/// An option struct as the library reads it: this crate's `T` (its `struct_size` first),
/// extended where a field set by name lies past `T` (a newer library's field), in 8-byte
/// words (every option struct holds a `size_t`, so 8 is its alignment).
pub(crate) struct OptionStruct {
    words: Vec<u64>,
}

impl OptionStruct {
    /// `base` (a `#[repr(C)]` option struct of `kind`, its `struct_size` first), then the
    /// number fields `named` sets, written as the library's table says each is stored. Fields
    /// the struct has beyond `T` start at the library's defaults (`sa_struct_default`). A name
    /// the library does not know, a field that is not a number, or a value its C type cannot
    /// hold is refused here, naming `op`; the values' ranges are the library's to check.
    pub(crate) fn new<T: Copy>(
        op: &str,
        kind: StructKind,
        base: &T,
        named: &[(String, f64)],
    ) -> Result<Self> {
        let base_size = std::mem::size_of::<T>();
        let fields = if named.is_empty() {
            Vec::new()
        } else {
            struct_fields(kind)
        };
        let mut placed = Vec::with_capacity(named.len());
        let mut size = base_size;
        for (name, value) in named {
            let field = fields.iter().find(|f| &f.name == name).ok_or_else(|| {
                let known: Vec<&str> = fields.iter().map(|f| f.name.as_str()).collect();
                invalid(format!(
                    "{}: the options have no field '{}' (the library's: {})",
                    op,
                    name,
                    known.join(", ")
                ))
            })?;
            let width = field.field_type.number_width().ok_or_else(|| {
                invalid(format!(
                    "{}: options field '{}' is not a number (set it through its own member)",
                    op, name
                ))
            })?;
            size = size.max(field.offset + width);
            placed.push((field, *value));
        }
        let mut words = vec![0u64; (size + 7) / 8];
        let bytes = words.as_mut_ptr().cast::<u8>();
        if size > base_size {
            // The library's defaults for the fields past T (T's own are written next).
            words[0] = size as u64;
            handleless_result(unsafe { sys::sa_struct_default(kind.code(), bytes.cast()) })?;
        }
        // SAFETY: `words` holds at least size_of::<T>() bytes, 8-aligned; T is plain data.
        unsafe { std::ptr::copy_nonoverlapping((base as *const T).cast::<u8>(), bytes, base_size) };
        words[0] = size as u64; // struct_size: as far as the caller's struct reaches
        for (field, value) in placed {
            let at = unsafe { bytes.add(field.offset) };
            match field.field_type {
                FieldType::Double => unsafe { at.cast::<f64>().write_unaligned(value) },
                FieldType::Uint64 => {
                    if !(value >= 0.0 && value < 18446744073709551616.0 && value.fract() == 0.0) {
                        return Err(invalid(format!(
                            "{}: options field '{}' is {}, not a uint64",
                            op, field.name, value
                        )));
                    }
                    unsafe { at.cast::<u64>().write_unaligned(value as u64) }
                }
                _ => {
                    if !(value >= i32::MIN as f64
                        && value <= i32::MAX as f64
                        && value.fract() == 0.0)
                    {
                        return Err(invalid(format!(
                            "{}: options field '{}' is {}, not an int32",
                            op, field.name, value
                        )));
                    }
                    unsafe { at.cast::<i32>().write_unaligned(value as i32) }
                }
            }
        }
        Ok(OptionStruct { words })
    }

    /// The struct's first `size_of::<T>()` bytes as `T` (the members this crate knows).
    pub(crate) fn head_mut<T>(&mut self) -> &mut T {
        assert!(self.words.len() * 8 >= std::mem::size_of::<T>());
        // SAFETY: at least size_of::<T>() bytes, 8-aligned, made from a T by new().
        unsafe { &mut *self.words.as_mut_ptr().cast::<T>() }
    }

    /// The struct for the C call.
    pub(crate) fn as_ptr<T>(&self) -> *const T {
        self.words.as_ptr().cast()
    }
}
