//! Builds `kernels/` (no_std Rust) to PTX with a nested cargo for `nvptx64-nvidia-cuda`,
//! embeds the PTX, and generates the kernel-name constants and dtype dispatch from the
//! PTX's `.entry` list (so a misspelt kernel name does not compile).
//!
//! Settings (environment): `OXIDNN_CUDA_ARCH` = `sm_80` (default: PTX that runs on sm_80 and
//! newer) or any other `sm_XX[a]`, e.g. `sm_90`.

use std::collections::BTreeMap;
use std::env;
use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

const DTYPES: [(&str, &str); 3] = [("f32", "F32"), ("f16", "F16"), ("bf16", "BF16")];

fn main() {
    let manifest =
        PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let out = PathBuf::from(env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    let kernels = manifest.join("kernels");
    for watched in [
        "kernels/src",
        "kernels/Cargo.toml",
        "params/src",
        "params/Cargo.toml",
    ] {
        println!("cargo:rerun-if-changed={watched}");
    }
    println!("cargo:rerun-if-env-changed=OXIDNN_CUDA_ARCH");
    let arch = env::var("OXIDNN_CUDA_ARCH").unwrap_or_else(|_| "sm_80".to_string());
    if !arch.starts_with("sm_")
        || !arch[3..]
            .trim_end_matches('a')
            .chars()
            .all(|c| c.is_ascii_digit())
    {
        fail(&format!(
            "OXIDNN_CUDA_ARCH must look like sm_80 or sm_90a, got {arch:?}"
        ));
    }

    let ptx = declare_dynamic_smem(&build_kernels(&kernels, &out, &arch));
    let embedded = out.join("oxidnn_kernels.ptx");
    fs::write(&embedded, &ptx)
        .unwrap_or_else(|e| fail(&format!("writing {}: {e}", embedded.display())));
    let names = entry_names(&ptx);
    if names.is_empty() {
        fail("the kernel PTX has no .entry: nothing to launch");
    }
    let generated = out.join("kernel_names.rs");
    fs::write(&generated, generate(&names, &arch))
        .unwrap_or_else(|e| fail(&format!("writing {}: {e}", generated.display())));
}

fn fail(message: &str) -> ! {
    eprintln!("error: oxidnn kernel build: {message}");
    std::process::exit(1);
}

/// Runs the nested kernel build and returns its PTX.
fn build_kernels(kernels: &Path, out: &Path, arch: &str) -> String {
    let cargo = env::var("CARGO").unwrap_or_else(|_| "cargo".to_string());
    let target_dir = out.join("kernels-target");
    let mut cmd = Command::new(cargo);
    cmd.current_dir(kernels)
        .args([
            "build",
            "--release",
            "--target",
            "nvptx64-nvidia-cuda",
            "-Zbuild-std=core",
        ])
        .arg("--target-dir")
        .arg(&target_dir);
    // The outer build's settings are for the host; the nested one starts clean.
    for (key, _) in env::vars() {
        let outer = key.starts_with("CARGO_") && key != "CARGO_HOME";
        if outer
            || [
                "RUSTFLAGS",
                "RUSTC",
                "RUSTC_WRAPPER",
                "RUSTDOC",
                "RUSTC_WORKSPACE_WRAPPER",
            ]
            .contains(&key.as_str())
        {
            cmd.env_remove(&key);
        }
    }
    cmd.env("RUSTC_BOOTSTRAP", "1")
        .env("CARGO_ENCODED_RUSTFLAGS", format!("-Ctarget-cpu={arch}"));
    let output = cmd
        .output()
        .unwrap_or_else(|e| fail(&format!("could not run cargo for kernels/: {e}")));
    if !output.status.success() {
        eprintln!("{}", String::from_utf8_lossy(&output.stderr));
        fail("compiling kernels/ to PTX failed (compiler output above)");
    }
    let ptx_path = target_dir.join("nvptx64-nvidia-cuda/release/oxidnn_kernels.ptx");
    fs::read_to_string(&ptx_path)
        .unwrap_or_else(|e| fail(&format!("reading {}: {e}", ptx_path.display())))
}

/// The module-scope symbol of dynamic shared memory that `device::dynamic_smem` names.
const DYNAMIC_SMEM: &str = ".extern .shared .align 16 .b8 oxidnn_dyn_smem[];";

/// Adds the dynamic shared-memory declaration after the PTX header: inline asm, where the
/// kernels name it, sits inside functions, and PTX accepts `.extern` only at module scope.
fn declare_dynamic_smem(ptx: &str) -> String {
    let header_end = ptx
        .find(".address_size 64")
        .map(|i| i + ".address_size 64".len())
        .unwrap_or_else(|| fail("the kernel PTX has no `.address_size 64` header"));
    format!(
        "{}\n{DYNAMIC_SMEM}\n{}",
        &ptx[..header_end],
        &ptx[header_end..]
    )
}

/// The names of the `.entry` functions in the PTX, sorted.
fn entry_names(ptx: &str) -> Vec<String> {
    let mut names: Vec<String> = ptx
        .lines()
        .filter_map(|l| l.trim().strip_prefix(".visible .entry "))
        .map(|rest| rest.split('(').next().unwrap_or("").trim().to_string())
        .filter(|n| !n.is_empty())
        .collect();
    names.sort();
    names.dedup();
    names
}

/// Splits `name` into its base and its trailing dtype suffixes (up to two).
fn split_dtypes(name: &str) -> (String, Vec<&'static str>) {
    let mut base = name.to_string();
    let mut found = Vec::new();
    'outer: for _ in 0..2 {
        for (suffix, variant) in DTYPES {
            if let Some(stripped) = base.strip_suffix(&format!("_{suffix}")) {
                base = stripped.to_string();
                found.insert(0, variant);
                continue 'outer;
            }
        }
        break;
    }
    (base, found)
}

fn generate(names: &[String], arch: &str) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "// Generated by build.rs from the kernel PTX's .entry list. Do not edit."
    );
    let _ = writeln!(s, "/// The architecture the embedded PTX was built for.");
    let _ = writeln!(s, "pub const PTX_ARCH: &str = {arch:?};");
    let _ = writeln!(s, "/// Every kernel entry point in the embedded PTX.");
    let _ = writeln!(s, "pub const ALL: &[&str] = &[");
    for n in names {
        let _ = writeln!(s, "    {n:?},");
    }
    let _ = writeln!(s, "];");
    let _ = writeln!(
        s,
        "/// The entry point named `name`, if the PTX has one (for names built at run time)."
    );
    let _ = writeln!(
        s,
        "pub fn lookup(name: &str) -> Option<&'static str> {{ ALL.iter().copied().find(|n| *n == name) }}"
    );
    let mut families: BTreeMap<String, Vec<(Vec<&str>, String)>> = BTreeMap::new();
    for n in names {
        let (base, dts) = split_dtypes(n);
        let _ = writeln!(s, "pub const {}: &str = {n:?};", n.to_uppercase());
        if !dts.is_empty() {
            families.entry(base).or_default().push((dts, n.clone()));
        }
    }
    for (base, members) in families {
        let arity = members[0].0.len();
        if members.iter().any(|(d, _)| d.len() != arity) {
            continue;
        }
        let params: Vec<String> = (0..arity).map(|i| format!("t{i}: DataType")).collect();
        let args: Vec<String> = (0..arity).map(|i| format!("t{i}")).collect();
        let _ = writeln!(
            s,
            "/// The `{base}_*` kernel for the given element type(s), if one exists."
        );
        let _ = writeln!(s, "#[allow(unreachable_patterns)]");
        let _ = writeln!(
            s,
            "pub fn {base}({}) -> Option<&'static str> {{",
            params.join(", ")
        );
        let _ = writeln!(s, "    match ({},) {{", args.join(", "));
        for (dts, name) in members {
            let pats: Vec<String> = dts.iter().map(|d| format!("DataType::{d}")).collect();
            let _ = writeln!(
                s,
                "        ({},) => Some({}),",
                pats.join(", "),
                name.to_uppercase()
            );
        }
        let _ = writeln!(s, "        _ => None,\n    }}\n}}");
    }
    s
}
