//! The hand-written declarations of lib.rs against what the C compiler says about
//! shardadam.h (probe/c_layout.c, run by build.rs): every struct size, field offset,
//! constant and SA_*_INIT default, by name, in both directions.
use super::*;
use std::collections::BTreeMap;
use std::mem::{size_of, MaybeUninit};

#[allow(clippy::excessive_precision)] // %.17e: every digit printf gives, for an exact read
mod c {
    include!(concat!(env!("OUT_DIR"), "/c_layout.rs"));
}

/// The byte offset of a field (std::mem::offset_of! needs Rust 1.77; Debian 12 has 1.63).
macro_rules! offset_of {
    ($t:ty, $f:tt) => {{
        let value = MaybeUninit::<$t>::uninit();
        let base = value.as_ptr();
        // SAFETY: addr_of! computes the field's address without reading the memory.
        let field = unsafe { ptr::addr_of!((*base).$f) };
        field as usize - base as usize
    }};
}

/// The same facts as the probe prints, from the Rust declarations.
fn rust_int_facts() -> BTreeMap<String, i64> {
    let mut facts = BTreeMap::new();
    let mut fact = |name: &str, value: i64| {
        assert!(
            facts.insert(name.to_string(), value).is_none(),
            "fact {} listed twice",
            name
        );
    };
    macro_rules! size {
        ($t:ty) => {
            fact(
                &format!("sizeof({})", stringify!($t)),
                size_of::<$t>() as i64,
            )
        };
    }
    macro_rules! offset {
        ($t:ty, $f:tt) => {
            fact(
                &format!(
                    "offsetof({}, {})",
                    stringify!($t),
                    stringify!($f).trim_start_matches("r#")
                ),
                offset_of!($t, $f) as i64,
            )
        };
    }
    macro_rules! constant {
        ($c:ident) => {
            fact(stringify!($c), $c as i64)
        };
    }

    size!(DLPackVersion);
    offset!(DLPackVersion, major);
    offset!(DLPackVersion, minor);
    size!(DLDevice);
    offset!(DLDevice, device_type);
    offset!(DLDevice, device_id);
    size!(DLDataType);
    offset!(DLDataType, code);
    offset!(DLDataType, bits);
    offset!(DLDataType, lanes);
    size!(DLTensor);
    offset!(DLTensor, data);
    offset!(DLTensor, device);
    offset!(DLTensor, ndim);
    offset!(DLTensor, dtype);
    offset!(DLTensor, shape);
    offset!(DLTensor, strides);
    offset!(DLTensor, byte_offset);
    size!(DLManagedTensor);
    offset!(DLManagedTensor, dl_tensor);
    offset!(DLManagedTensor, manager_ctx);
    offset!(DLManagedTensor, deleter);
    size!(DLManagedTensorVersioned);
    offset!(DLManagedTensorVersioned, version);
    offset!(DLManagedTensorVersioned, manager_ctx);
    offset!(DLManagedTensorVersioned, deleter);
    offset!(DLManagedTensorVersioned, flags);
    offset!(DLManagedTensorVersioned, dl_tensor);
    constant!(kDLCPU);
    constant!(kDLCUDA);
    constant!(kDLInt);
    constant!(kDLUInt);
    constant!(kDLFloat);
    constant!(kDLBfloat);
    constant!(kDLFloat8_e4m3fn);
    constant!(kDLFloat8_e5m2);
    constant!(kDLFloat8_e8m0fnu);
    constant!(DLPACK_FLAG_BITMASK_READ_ONLY);

    constant!(SA_VERSION_MAJOR);
    constant!(SA_VERSION_MINOR);
    constant!(SA_VERSION_PATCH);
    constant!(SA_VERSION_NUMBER);
    constant!(SA_MAX_NDIM);
    size!(sa_status);
    constant!(SA_OK);
    constant!(SA_ERR_INVALID_ARGUMENT);
    constant!(SA_ERR_UNSUPPORTED);
    constant!(SA_ERR_OUT_OF_MEMORY);
    constant!(SA_ERR_DEVICE);
    constant!(SA_ERR_COMM);
    constant!(SA_ERR_IO);
    constant!(SA_ERR_FORMAT);
    constant!(SA_ERR_MISMATCH);
    constant!(SA_ERR_STATE);
    constant!(SA_ERR_INTERNAL);
    constant!(SA_PLACEMENT_REPLICATE);
    constant!(SA_PLACEMENT_SHARD);
    constant!(SA_PLACEMENT_PARTIAL);
    constant!(SA_RULE_ADAMW);
    constant!(SA_RULE_MUON);
    constant!(SA_MUON_LR_ORIGINAL);
    constant!(SA_MUON_LR_MATCH_RMS_ADAMW);
    constant!(SA_MASTER_AUTO);
    constant!(SA_MASTER_NONE);
    constant!(SA_MASTER_FP32);
    constant!(SA_MASTER_REMAINDER);
    constant!(SA_STATE_ON_DEVICE);
    constant!(SA_STATE_ON_HOST);
    constant!(SA_STATE_ON_HOST_CPU_STEP);

    size!(sa_placement);
    offset!(sa_placement, r#type);
    offset!(sa_placement, dim);

    size!(sa_layout);
    offset!(sa_layout, struct_size);
    offset!(sa_layout, ndim);
    offset!(sa_layout, global_shape);
    offset!(sa_layout, mesh_ndim);
    offset!(sa_layout, mesh_shape);
    offset!(sa_layout, mesh_coord);
    offset!(sa_layout, placements);
    offset!(sa_layout, global_offset);
    let layout = sa_layout::default();
    fact("SA_LAYOUT_INIT.struct_size", layout.struct_size as i64);
    fact("SA_LAYOUT_INIT.ndim", layout.ndim as i64);
    fact("SA_LAYOUT_INIT.mesh_ndim", layout.mesh_ndim as i64);
    fact(
        "SA_LAYOUT_INIT.null_pointers",
        (layout.global_shape.is_null()
            && layout.mesh_shape.is_null()
            && layout.mesh_coord.is_null()
            && layout.placements.is_null()
            && layout.global_offset.is_null()) as i64,
    );

    size!(sa_optimizer_config);
    offset!(sa_optimizer_config, struct_size);
    offset!(sa_optimizer_config, num_threads);
    offset!(sa_optimizer_config, cpu_simd);
    let config = sa_optimizer_config::default();
    fact(
        "SA_OPTIMIZER_CONFIG_INIT.struct_size",
        config.struct_size as i64,
    );
    fact(
        "SA_OPTIMIZER_CONFIG_INIT.num_threads",
        config.num_threads as i64,
    );
    fact("SA_OPTIMIZER_CONFIG_INIT.cpu_simd", config.cpu_simd as i64);

    size!(sa_field_info);
    offset!(sa_field_info, struct_size);
    offset!(sa_field_info, name);
    offset!(sa_field_info, r#type);
    offset!(sa_field_info, offset);
    offset!(sa_field_info, default_value);
    offset!(sa_field_info, min);
    offset!(sa_field_info, max);
    offset!(sa_field_info, max_inclusive);
    offset!(sa_field_info, fixed_with_params);
    offset!(sa_field_info, rule);
    offset!(sa_field_info, doc);
    offset!(sa_field_info, dtype_role);
    offset!(sa_field_info, rules);
    size!(sa_dtype_info);
    offset!(sa_dtype_info, struct_size);
    offset!(sa_dtype_info, name);
    offset!(sa_dtype_info, dtype);
    offset!(sa_dtype_info, roles);
    offset!(sa_dtype_info, safetensors_name);
    offset!(sa_dtype_info, doc);
    constant!(SA_DTYPE_PARAM);
    constant!(SA_DTYPE_GRAD);
    constant!(SA_DTYPE_MOMENT);
    constant!(SA_DTYPE_STATE);
    constant!(SA_DTYPE_FILE);
    constant!(SA_DTYPE_BLOCK_MOMENT);
    constant!(SA_DTYPE_SCALE);
    constant!(SA_DTYPE_SCALED_PARAM);
    let dtype_info = sa_dtype_info::default();
    fact(
        "SA_DTYPE_INFO_INIT.struct_size",
        dtype_info.struct_size as i64,
    );
    fact(
        "SA_DTYPE_INFO_INIT.null_pointers",
        (dtype_info.name.is_null()
            && dtype_info.safetensors_name.is_null()
            && dtype_info.doc.is_null()
            && dtype_info.dtype.bits == 0) as i64,
    );
    constant!(SA_FIELD_DOUBLE);
    constant!(SA_FIELD_FLAG);
    constant!(SA_FIELD_INT32);
    constant!(SA_FIELD_POINTER);
    constant!(SA_FIELD_UINT64);
    constant!(SA_FIELD_DTYPE);
    constant!(SA_STRUCT_GROUP_CONFIG);
    constant!(SA_STRUCT_STEP_ARGS);
    constant!(SA_STRUCT_OPTIMIZER_CONFIG);
    constant!(SA_STRUCT_PARAM_OPTIONS);
    constant!(SA_STRUCT_IMPORT_OPTIONS);
    let field = sa_field_info::default();
    fact("SA_FIELD_INFO_INIT.struct_size", field.struct_size as i64);
    fact(
        "SA_FIELD_INFO_INIT.null_pointers",
        (field.name.is_null() && field.rule.is_null() && field.doc.is_null()) as i64,
    );

    constant!(SA_SCALING_NONE);
    constant!(SA_SCALING_DELAYED);
    constant!(SA_SCALING_MXFP8);
    constant!(SA_SCALING_BLOCK128);
    constant!(SA_SCALING_CURRENT);
    constant!(SA_SCALING_CURRENT_POW2);
    size!(sa_param_scaling_info);
    offset!(sa_param_scaling_info, struct_size);
    offset!(sa_param_scaling_info, value);
    offset!(sa_param_scaling_info, name);
    offset!(sa_param_scaling_info, block);
    offset!(sa_param_scaling_info, scale_dtype);
    offset!(sa_param_scaling_info, step_writes_scale);
    offset!(sa_param_scaling_info, doc);
    let scaling_info = sa_param_scaling_info::default();
    fact(
        "SA_PARAM_SCALING_INFO_INIT.struct_size",
        scaling_info.struct_size as i64,
    );
    fact(
        "SA_PARAM_SCALING_INFO_INIT.value",
        scaling_info.value as i64,
    );
    fact("SA_PARAM_SCALING_INFO_INIT.block", scaling_info.block);
    fact(
        "SA_PARAM_SCALING_INFO_INIT.scale_dtype.bits",
        scaling_info.scale_dtype.bits as i64,
    );
    fact(
        "SA_PARAM_SCALING_INFO_INIT.step_writes_scale",
        scaling_info.step_writes_scale as i64,
    );
    fact(
        "SA_PARAM_SCALING_INFO_INIT.null_pointers",
        (scaling_info.name.is_null() && scaling_info.doc.is_null()) as i64,
    );

    size!(sa_param_options);
    offset!(sa_param_options, struct_size);
    offset!(sa_param_options, grad_dtype);
    offset!(sa_param_options, moment_dtype);
    offset!(sa_param_options, master);
    offset!(sa_param_options, scale);
    offset!(sa_param_options, amax);
    offset!(sa_param_options, scaling);
    offset!(sa_param_options, margin);
    offset!(sa_param_options, state_placement);
    let options = sa_param_options::default();
    fact(
        "SA_PARAM_OPTIONS_INIT.struct_size",
        options.struct_size as i64,
    );
    fact(
        "SA_PARAM_OPTIONS_INIT.grad_dtype.bits",
        options.grad_dtype.bits as i64,
    );
    fact(
        "SA_PARAM_OPTIONS_INIT.moment_dtype.bits",
        options.moment_dtype.bits as i64,
    );
    fact("SA_PARAM_OPTIONS_INIT.master", options.master as i64);
    fact(
        "SA_PARAM_OPTIONS_INIT.null_pointers",
        (options.scale.is_null() && options.amax.is_null()) as i64,
    );
    fact("SA_PARAM_OPTIONS_INIT.scaling", options.scaling as i64);
    fact("SA_PARAM_OPTIONS_INIT.margin", options.margin as i64);
    fact(
        "SA_PARAM_OPTIONS_INIT.state_placement",
        options.state_placement as i64,
    );

    size!(sa_param_info);
    offset!(sa_param_info, struct_size);
    offset!(sa_param_info, name);
    offset!(sa_param_info, group);
    offset!(sa_param_info, ndim);
    offset!(sa_param_info, local_shape);
    offset!(sa_param_info, global_shape);
    offset!(sa_param_info, global_offset);
    offset!(sa_param_info, numel);
    offset!(sa_param_info, param_dtype);
    offset!(sa_param_info, grad_dtype);
    offset!(sa_param_info, moment_dtype);
    offset!(sa_param_info, master);
    offset!(sa_param_info, device);
    offset!(sa_param_info, scaling);
    offset!(sa_param_info, margin);
    offset!(sa_param_info, state_placement);
    let info = sa_param_info::default();
    fact("SA_PARAM_INFO_INIT.struct_size", info.struct_size as i64);
    fact(
        "SA_PARAM_INFO_INIT.device.device_type",
        info.device.device_type as i64,
    );
    fact("SA_PARAM_INFO_INIT.scaling", info.scaling as i64);
    fact("SA_PARAM_INFO_INIT.margin", info.margin as i64);
    fact(
        "SA_PARAM_INFO_INIT.state_placement",
        info.state_placement as i64,
    );

    size!(sa_step_args);
    offset!(sa_step_args, struct_size);
    offset!(sa_step_args, inv_grad_scale);
    offset!(sa_step_args, found_inf);
    offset!(sa_step_args, skipped);
    offset!(sa_step_args, max_grad_norm);
    offset!(sa_step_args, norm_type);
    offset!(sa_step_args, grad_norm);
    offset!(sa_step_args, host_grad_norm);
    fact("SA_NO_GRAD", SA_NO_GRAD as usize as i64);
    fact("SA_NORM_L2", SA_NORM_L2 as i64);
    fact("SA_NORM_INF", SA_NORM_INF as i64);
    let args = sa_step_args::default();
    fact("SA_STEP_ARGS_INIT.struct_size", args.struct_size as i64);
    fact(
        "SA_STEP_ARGS_INIT.null_pointers",
        (args.inv_grad_scale.is_null()
            && args.found_inf.is_null()
            && args.skipped.is_null()
            && args.grad_norm.is_null()
            && args.host_grad_norm.is_null()) as i64,
    );
    fact("SA_STEP_ARGS_INIT.norm_type", args.norm_type as i64);
    fact("SA_REDUCE_SUM", SA_REDUCE_SUM as i64);
    fact("SA_REDUCE_MAX", SA_REDUCE_MAX as i64);
    size!(sa_host_comm);
    offset!(sa_host_comm, struct_size);
    offset!(sa_host_comm, ctx);
    offset!(sa_host_comm, all_reduce);
    offset!(sa_host_comm, release);
    offset!(sa_host_comm, rank);
    offset!(sa_host_comm, nranks);
    offset!(sa_host_comm, all_to_all);
    let host_comm = sa_host_comm::default();
    fact(
        "SA_HOST_COMM_INIT.struct_size",
        host_comm.struct_size as i64,
    );
    fact(
        "SA_HOST_COMM_INIT.null_pointers",
        (host_comm.ctx.is_null()
            && host_comm.all_reduce.is_none()
            && host_comm.release.is_none()
            && host_comm.rank == 0
            && host_comm.nranks == 0
            && host_comm.all_to_all.is_none())
            as i64,
    );
    size!(sa_nccl_unique_id);

    size!(sa_writer);
    offset!(sa_writer, struct_size);
    offset!(sa_writer, ctx);
    offset!(sa_writer, write);
    offset!(sa_writer, commit);
    offset!(sa_writer, release);
    offset!(sa_writer, write_at);
    offset!(sa_writer, reserve);
    let writer = sa_writer::default();
    fact("SA_WRITER_INIT.struct_size", writer.struct_size as i64);
    let writer_nulls = writer.ctx.is_null()
        && writer.write.is_none()
        && writer.commit.is_none()
        && writer.release.is_none()
        && writer.write_at.is_none()
        && writer.reserve.is_none();
    fact("SA_WRITER_INIT.null_pointers", writer_nulls as i64);

    size!(sa_reader);
    offset!(sa_reader, struct_size);
    offset!(sa_reader, ctx);
    offset!(sa_reader, size);
    offset!(sa_reader, read_at);
    offset!(sa_reader, release);
    offset!(sa_reader, name);
    offset!(sa_reader, concurrent);
    let reader = sa_reader::default();
    fact("SA_READER_INIT.concurrent", reader.concurrent as i64);
    fact("SA_READER_INIT.struct_size", reader.struct_size as i64);
    fact("SA_READER_INIT.size", reader.size as i64);
    let reader_nulls = reader.ctx.is_null()
        && reader.read_at.is_none()
        && reader.release.is_none()
        && reader.name.is_null();
    fact("SA_READER_INIT.null_pointers", reader_nulls as i64);

    size!(sa_import_options);
    offset!(sa_import_options, struct_size);
    offset!(sa_import_options, staging_bytes);
    offset!(sa_import_options, allow_missing);
    offset!(sa_import_options, allow_unexpected);
    offset!(sa_import_options, restore_groups);
    offset!(sa_import_options, read_once);
    let import = sa_import_options::default();
    fact(
        "SA_IMPORT_OPTIONS_INIT.struct_size",
        import.struct_size as i64,
    );
    fact(
        "SA_IMPORT_OPTIONS_INIT.staging_bytes",
        import.staging_bytes as i64,
    );
    fact(
        "SA_IMPORT_OPTIONS_INIT.allow_missing",
        import.allow_missing as i64,
    );
    fact(
        "SA_IMPORT_OPTIONS_INIT.allow_unexpected",
        import.allow_unexpected as i64,
    );
    fact(
        "SA_IMPORT_OPTIONS_INIT.restore_groups",
        import.restore_groups as i64,
    );
    fact("SA_IMPORT_OPTIONS_INIT.read_once", import.read_once as i64);
    facts
}

fn rust_float_facts() -> BTreeMap<String, f64> {
    [(
        "SA_STEP_ARGS_INIT.max_grad_norm",
        sa_step_args::default().max_grad_norm,
    )]
    .iter()
    .map(|(name, value)| (name.to_string(), *value))
    .collect()
}

/// Lists every fact that differs or that only one side knows.
fn differences<T: PartialEq + std::fmt::Debug + Copy>(
    c_facts: &[(&str, T)],
    rust_facts: &BTreeMap<String, T>,
) -> Vec<String> {
    let mut out = Vec::new();
    let mut seen = BTreeMap::new();
    for (name, c_value) in c_facts {
        seen.insert(name.to_string(), ());
        match rust_facts.get(*name) {
            None => out.push(format!(
                "{}: C says {:?}, lib.rs does not declare it",
                name, c_value
            )),
            Some(r) if r != c_value => out.push(format!(
                "{}: C says {:?}, lib.rs says {:?}",
                name, c_value, r
            )),
            Some(_) => {}
        }
    }
    for name in rust_facts.keys() {
        if !seen.contains_key(name) {
            out.push(format!("{}: lib.rs lists it, the C probe does not", name));
        }
    }
    out
}

#[test]
fn declarations_match_the_c_header() {
    if let Some(why) = c::PROBE_ERROR {
        panic!("no C facts to compare with: {}", why);
    }
    let mut problems = differences(c::C_INT_FACTS, &rust_int_facts());
    problems.extend(differences(c::C_FLOAT_FACTS, &rust_float_facts()));
    assert!(
        problems.is_empty(),
        "lib.rs disagrees with shardadam.h:\n  {}",
        problems.join("\n  ")
    );
    assert!(
        c::C_INT_FACTS.len() > 100,
        "the probe listed only {} facts",
        c::C_INT_FACTS.len()
    );
}

/// Every declared function resolves in the library that was linked: taking each address
/// makes the linker look every symbol up, so a name the library lacks fails this test.
#[test]
fn every_declared_function_is_exported_by_the_library() {
    macro_rules! addresses {
        ($($f:ident),* $(,)?) => {
            vec![$((stringify!($f), $f as *const () as usize)),*]
        };
    }
    let functions = addresses!(
        sa_version,
        sa_build_info,
        sa_status_string,
        sa_last_error,
        sa_layout_local_box,
        sa_optimizer_create,
        sa_optimizer_destroy,
        sa_optimizer_last_error,
        sa_group_config_num_fields,
        sa_group_config_field,
        sa_num_dtypes,
        sa_dtype,
        sa_num_param_scalings,
        sa_param_scaling_describe,
        sa_optimizer_num_groups,
        sa_optimizer_add_group_fields,
        sa_optimizer_set_group_fields,
        sa_optimizer_get_group_fields,
        sa_optimizer_set_lr,
        sa_optimizer_get_step,
        sa_optimizer_set_step,
        sa_optimizer_add_param,
        sa_optimizer_add_param_legacy,
        sa_optimizer_num_params,
        sa_optimizer_find_param,
        sa_optimizer_param_info,
        sa_optimizer_get_param_steps,
        sa_optimizer_set_param_steps,
        sa_optimizer_set_grad,
        sa_optimizer_set_grads,
        sa_optimizer_clear_grad,
        sa_optimizer_set_grad_ptrs,
        sa_optimizer_step,
        sa_optimizer_step_params,
        sa_optimizer_flush,
        sa_optimizer_state_view,
        sa_optimizer_get_moment_values,
        sa_optimizer_recast_params,
        sa_optimizer_reset_masters,
        sa_file_writer,
        sa_memory_writer,
        sa_memory_writer_data,
        sa_file_reader,
        sa_memory_reader,
        sa_writer_release,
        sa_reader_release,
        sa_optimizer_export,
        sa_optimizer_export_async,
        sa_export_job_wait,
        sa_export_job_poll,
        sa_export_job_last_error,
        sa_export_job_release,
        sa_optimizer_import,
        sa_inspect,
        sa_free,
    );
    for (name, address) in functions {
        assert_ne!(address, 0, "{} did not resolve", name);
    }
    // The loaded library is the version these declarations follow.
    assert_eq!(
        unsafe { sa_version() } / 100,
        SA_VERSION_NUMBER / 100,
        "library major.minor"
    );
}
