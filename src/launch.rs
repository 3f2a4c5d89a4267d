//! The GPU side of a handle: CUDA context, stream, the embedded PTX modules (one per op
//! family, each loaded the first time one of its kernels runs) and a cache of their
//! functions; and the one function that launches a kernel.

use crate::buffer::{Buffer, Memory};
use crate::error::{Error, Result};
use cudarc::driver::{result, sys, CudaContext, CudaSlice, CudaStream, DevicePtr, DevicePtrMut};
use oxidnn_params::{BARRIER_GROUPS, COUNTER_WORDS};
use std::borrow::Cow;
use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::ffi::{c_void, CString};
use std::sync::{Arc, Mutex};

/// The kernels' PTX, one module per op family, built by build.rs from `kernels/`.
pub(crate) mod modules {
    include!(concat!(env!("OUT_DIR"), "/kernel_modules.rs"));
}

/// The PTX of op family `family`: the embedded module, or, where `OXIDNN_PTX_DIR` is set
/// and holds `<family>.ptx`, that file. For kernel development: a family rebuilt on its
/// own runs in a program built before, without relinking it (the file must define every
/// kernel of the family the program launches, with the same parameters).
fn module_text(family: &str, embedded: &'static str) -> Result<Cow<'static, str>> {
    let Some(dir) = std::env::var_os("OXIDNN_PTX_DIR") else {
        return Ok(Cow::Borrowed(embedded));
    };
    let path = std::path::Path::new(&dir).join(format!("{family}.ptx"));
    if !path.exists() {
        return Ok(Cow::Borrowed(embedded));
    }
    std::fs::read_to_string(&path).map(Cow::Owned).map_err(|e| {
        Error::unsupported(format!(
            "OXIDNN_PTX_DIR: cannot read {}: {e}",
            path.display()
        ))
    })
}

/// A raw module handle. Invariant: loaded in `ctx`, unloaded once, on drop.
struct Module {
    raw: sys::CUmodule,
    ctx: Arc<CudaContext>,
}

// SAFETY: CUmodule handles may be used from any thread once the owning context is bound.
unsafe impl Send for Module {}
unsafe impl Sync for Module {}

impl Drop for Module {
    fn drop(&mut self) {
        if self.ctx.bind_to_thread().is_ok() {
            // SAFETY: `raw` was loaded by `load_data` and is unloaded only here. Errors
            // cannot be reported from drop and are ignored.
            let _ = unsafe { result::module::unload(self.raw) };
        }
    }
}

/// A function handle of the module. Invariant: valid while its `Module` is loaded, which
/// the owning `Gpu` guarantees by holding both.
#[derive(Clone, Copy)]
struct Function(sys::CUfunction);
// SAFETY: CUfunction handles are immutable, context-bound identifiers.
unsafe impl Send for Function {}
unsafe impl Sync for Function {}

/// A loaded function and its shared memory: the static size its PTX declares, and the
/// dynamic size it has been allowed so far (`CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES`).
#[derive(Clone, Copy)]
struct Loaded {
    function: Function,
    static_shared: u32,
    dynamic_allowed: u32,
}

pub(crate) struct Gpu {
    pub(crate) ctx: Arc<CudaContext>,
    pub(crate) stream: Arc<CudaStream>,
    /// The modules of [`modules::ptx`], each loaded on first use (loading JIT-compiles
    /// the PTX, or takes it from the driver's cache).
    modules: Mutex<Vec<Option<Arc<Module>>>>,
    /// Each function used so far (see [`Loaded`]).
    functions: Mutex<HashMap<&'static str, Loaded>>,
    pub(crate) sm_count: u32,
    /// Shared memory of one SM, and the most of it one block may use (dynamic and
    /// reserved together: each block also takes `shared_reserved_per_block`).
    pub(crate) shared_per_sm: u32,
    pub(crate) shared_per_block_optin: u32,
    pub(crate) shared_reserved_per_block: u32,
    /// The state of the kernels' grid and group barriers (`device::group_barrier`): a
    /// word per group of [`BARRIER_GROUPS`], zeroed when allocated (on first use); every
    /// such launch leaves them ready for the next, and the stream orders the launches.
    grid_barrier: Mutex<Option<CudaSlice<u32>>>,
    /// The kernels' counter state: [`COUNTER_WORDS`] words, zeroed when allocated (on
    /// first use); every launch that counts in them leaves them 0 again, and the stream
    /// orders the launches.
    counters: Mutex<Option<CudaSlice<u32>>>,
    /// Compute capability, (major, minor).
    pub(crate) compute_capability: (u32, u32),
    pub(crate) name: String,
}

/// Launch geometry: a `grid x grid_y` grid of `block`-thread blocks with `shared_bytes` of
/// dynamic shared memory each.
#[derive(Clone, Copy, Debug)]
pub(crate) struct LaunchConfig {
    pub grid: u32,
    pub grid_y: u32,
    pub block: u32,
    pub shared_bytes: u32,
}

impl LaunchConfig {
    /// Enough blocks of `block` threads for `threads` threads (at least one block).
    pub fn for_threads(threads: u64, block: u32) -> Result<Self> {
        let grid = threads.div_ceil(block as u64).max(1);
        if grid > i32::MAX as u64 {
            return Err(Error::unsupported(format!(
                "{threads} threads need more than 2^31-1 blocks"
            )));
        }
        Ok(Self {
            grid: grid as u32,
            grid_y: 1,
            block,
            shared_bytes: 0,
        })
    }
}

impl Gpu {
    /// Opens device `ordinal`: a context and its default stream (modules load lazily).
    pub(crate) fn open(ordinal: usize) -> Result<Self> {
        // SAFETY: only probes whether libcuda can be loaded.
        if !unsafe { sys::is_culib_present() } {
            return Err(Error::NoGpu {
                reason: "the CUDA driver library (libcuda.so) was not found".into(),
            });
        }
        let count = CudaContext::device_count().map_err(|e| Error::NoGpu {
            reason: format!("cuDeviceGetCount: {e:?}"),
        })?;
        if count <= ordinal as i32 {
            return Err(Error::NoGpu {
                reason: format!("device {ordinal} requested, {count} present"),
            });
        }
        let ctx = CudaContext::new(ordinal).map_err(|e| Error::NoGpu {
            reason: format!("cuCtxCreate: {e:?}"),
        })?;
        // One stream orders every op of the handle; cudarc's per-buffer event tracking is
        // not needed and would add work to every launch.
        // SAFETY: called before any buffer of this context exists.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.default_stream();
        ctx.bind_to_thread()
            .map_err(|e| Error::driver("cuCtxSetCurrent", e))?;
        let sm_count = ctx
            .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .map_err(|e| Error::driver("cuDeviceGetAttribute", e))? as u32;
        let attribute = |a| {
            ctx.attribute(a)
                .map_err(|e| Error::driver("cuDeviceGetAttribute", e))
                .map(|v| v as u32)
        };
        let compute_capability = (
            attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
            attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?,
        );
        let name = ctx.name().unwrap_or_else(|_| "unknown GPU".into());
        use sys::CUdevice_attribute as A;
        let shared_per_sm = attribute(A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR)?;
        let shared_per_block_optin =
            attribute(A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)?;
        let shared_reserved_per_block =
            attribute(A::CU_DEVICE_ATTRIBUTE_RESERVED_SHARED_MEMORY_PER_BLOCK)?;
        Ok(Self {
            ctx,
            stream,
            modules: Mutex::new(vec![None; modules::ptx().len()]),
            functions: Mutex::new(HashMap::new()),
            sm_count,
            shared_per_sm,
            shared_per_block_optin,
            shared_reserved_per_block,
            grid_barrier: Mutex::new(None),
            counters: Mutex::new(None),
            compute_capability,
            name,
        })
    }

    /// Runs `f` on the function `name`, loaded on first use (see [`Loaded`]), with the
    /// cache locked (so raising its shared-memory limit is one step).
    fn with_loaded<R>(
        &self,
        name: &'static str,
        f: impl FnOnce(&mut Loaded) -> Result<R>,
    ) -> Result<R> {
        let mut cache = self.functions.lock().unwrap_or_else(|p| p.into_inner());
        let entry = match cache.entry(name) {
            Entry::Occupied(e) => e.into_mut(),
            Entry::Vacant(e) => e.insert(self.load_function(name)?),
        };
        f(entry)
    }

    /// Whether `shared_bytes` of dynamic shared memory fit beside `loaded`'s static shared
    /// memory in one block (the device's opt-in limit per block bounds the two together).
    fn shared_fits(&self, loaded: &Loaded, shared_bytes: u32) -> bool {
        loaded.static_shared as u64 + shared_bytes as u64 <= self.shared_per_block_optin as u64
    }

    /// The function `name`, allowed `shared_bytes` of dynamic shared memory; an
    /// [`Error::NotSupported`] naming it where that and its static shared memory together
    /// exceed what a block of this device may have.
    fn function(&self, name: &'static str, shared_bytes: u32) -> Result<Function> {
        self.with_loaded(name, |entry| {
            if shared_bytes <= entry.dynamic_allowed {
                return Ok(entry.function);
            }
            if !self.shared_fits(entry, shared_bytes) {
                return Err(Error::unsupported(format!(
                    "`{name}` with {shared_bytes} bytes of dynamic shared memory beside its {} \
                     static: this device allows {} bytes a block",
                    entry.static_shared, self.shared_per_block_optin
                )));
            }
            let set = |attribute, value: u32| {
                // SAFETY: `entry.function` is a valid function of the loaded module.
                unsafe {
                    result::function::set_function_attribute(
                        entry.function.0,
                        attribute,
                        value as i32,
                    )
                }
                .map_err(|e| Error::driver("cuFuncSetAttribute", e))
            };
            // Tiled kernels run more blocks per SM with the largest carveout. The dynamic
            // limit is raised whatever the size: by default it is 48 KB less the static
            // shared memory, so a kernel with static memory could not have 48 KB itself.
            set(
                sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT,
                100,
            )?;
            set(
                sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                shared_bytes,
            )?;
            entry.dynamic_allowed = shared_bytes;
            Ok(entry.function)
        })
    }

    /// Whether this device runs the Hopper (`sm_90a`) kernels: compute capability 9.0
    /// exactly (architecture-specific PTX runs on no other).
    pub(crate) fn is_sm90a(&self) -> bool {
        self.compute_capability == (9, 0)
    }

    /// The loaded module holding `kernel`, loading it if this is its family's first use.
    fn module_of(&self, kernel: &str) -> Result<Arc<Module>> {
        let index = modules::module_index(kernel)
            .ok_or_else(|| Error::bad("kernel", format!("no PTX module holds `{kernel}`")))?;
        if modules::ARCHS[index] == "sm_90a" && !self.is_sm90a() {
            let (major, minor) = self.compute_capability;
            return Err(Error::unsupported(format!(
                "`{kernel}` is sm_90a code; this device is compute capability {major}.{minor}"
            )));
        }
        let mut loaded = self.modules.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(m) = &loaded[index] {
            return Ok(m.clone());
        }
        let (family, embedded) = modules::ptx()[index];
        let ptx = module_text(family, embedded)?;
        let ptx = CString::new(ptx.into_owned())
            .map_err(|_| Error::unsupported(format!("the `{family}` PTX contains a NUL byte")))?;
        self.ctx
            .bind_to_thread()
            .map_err(|e| Error::driver("cuCtxSetCurrent", e))?;
        // SAFETY: `ptx` is a NUL-terminated PTX image that outlives the call.
        let raw = unsafe { result::module::load_data(ptx.as_ptr() as *const c_void) }
            .map_err(|e| Error::driver("cuModuleLoadData", e))?;
        let module = Arc::new(Module {
            raw,
            ctx: self.ctx.clone(),
        });
        loaded[index] = Some(module.clone());
        Ok(module)
    }

    fn load_function(&self, name: &'static str) -> Result<Loaded> {
        let cname = CString::new(name).map_err(|_| Error::bad("kernel", "name contains NUL"))?;
        let module = self.module_of(name)?;
        // SAFETY: the module stays loaded for the life of `self`, which holds it.
        let raw = unsafe { result::module::get_function(module.raw, cname) }
            .map_err(|e| Error::driver("cuModuleGetFunction", e))?;
        // Kernels that tile through shared memory run more blocks per SM with the largest
        // shared-memory carveout (L1 matters little to them).
        // SAFETY: `raw` is a valid function of the loaded module.
        let smem = unsafe {
            result::function::get_function_attribute(
                raw,
                sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES,
            )
        }
        .map_err(|e| Error::driver("cuFuncGetAttribute", e))?;
        if smem >= 4096 {
            // SAFETY: as above; 100 = the maximum shared-memory carveout, in percent.
            unsafe {
                result::function::set_function_attribute(
                    raw,
                    sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT,
                    100,
                )
            }
            .map_err(|e| Error::driver("cuFuncSetAttribute", e))?;
        }
        Ok(Loaded {
            function: Function(raw),
            static_shared: smem.max(0) as u32,
            dynamic_allowed: 0,
        })
    }

    /// The largest block `kernel` can be launched with (its registers per thread bound it).
    pub(crate) fn max_threads_per_block(&self, kernel: &'static str) -> Result<u32> {
        let f = self.function(kernel, 0)?;
        // SAFETY: `f` is a valid function of the loaded module.
        let threads = unsafe {
            result::function::get_function_attribute(
                f.0,
                sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK,
            )
        }
        .map_err(|e| Error::driver("cuFuncGetAttribute", e))?;
        Ok(threads.max(0) as u32)
    }

    /// Launches `kernel(params, pointers..)` on the handle's stream.
    ///
    /// # Safety
    /// `kernel`'s PTX signature is `(P, u64 * pointers.len())`; the pointers and `params`
    /// describe memory the kernel may access for the whole launch (the ops layer checks
    /// every buffer against its descriptor before calling this).
    pub(crate) unsafe fn launch<P: Copy>(
        &self,
        kernel: &'static str,
        cfg: LaunchConfig,
        params: &P,
        pointers: &[u64],
    ) -> Result<()> {
        // SAFETY: the caller's contract.
        unsafe { self.launch_params(kernel, cfg, params, pointers, false) }
    }

    /// [`Self::launch`] as a cooperative launch (cuLaunchCooperativeKernel): every block
    /// of the grid is resident at once, or the launch fails; the kernels that need it
    /// synchronize the grid with `device::grid_barrier` on [`Self::grid_barrier`].
    ///
    /// # Safety
    /// As [`Self::launch`].
    pub(crate) unsafe fn launch_cooperative<P: Copy>(
        &self,
        kernel: &'static str,
        cfg: LaunchConfig,
        params: &P,
        pointers: &[u64],
    ) -> Result<()> {
        // SAFETY: the caller's contract.
        unsafe { self.launch_params(kernel, cfg, params, pointers, true) }
    }

    /// [`Self::launch`] or [`Self::launch_cooperative`].
    ///
    /// # Safety
    /// As [`Self::launch`].
    unsafe fn launch_params<P: Copy>(
        &self,
        kernel: &'static str,
        cfg: LaunchConfig,
        params: &P,
        pointers: &[u64],
        cooperative: bool,
    ) -> Result<()> {
        let f = self.function(kernel, cfg.shared_bytes)?;
        let mut slots: Vec<*mut c_void> = Vec::with_capacity(1 + pointers.len());
        slots.push(params as *const P as *mut c_void);
        for p in pointers {
            slots.push(p as *const u64 as *mut c_void);
        }
        self.launch_slots(kernel, f, cfg, &mut slots, cooperative)
    }

    /// The device address of the barrier state (see the field): group `g`'s word at `g`,
    /// the grid's the first.
    pub(crate) fn grid_barrier(&self) -> Result<u64> {
        self.zeroed_words(&self.grid_barrier, BARRIER_GROUPS)
    }

    /// The device address of the counter state (see the field): [`COUNTER_WORDS`] words,
    /// each 0 whenever no launch that uses it is running.
    pub(crate) fn counters(&self) -> Result<u64> {
        self.zeroed_words(&self.counters, COUNTER_WORDS)
    }

    /// The device address of `state`'s `words` words, allocated zeroed on first use.
    fn zeroed_words(&self, state: &Mutex<Option<CudaSlice<u32>>>, words: u32) -> Result<u64> {
        let mut state = state.lock().unwrap_or_else(|p| p.into_inner());
        if state.is_none() {
            let zeroed = self
                .stream
                .alloc_zeros::<u32>(words as usize)
                .map_err(|e| Error::driver("cuMemAllocAsync", e))?;
            *state = Some(zeroed);
        }
        let slice = state.as_ref().expect("allocated above");
        let address = slice.device_ptr(&self.stream).0;
        Ok(address)
    }

    /// Launches `kernel(params, pointers.., last)` on the handle's stream: [`Self::launch`]
    /// with one more parameter passed by value after the pointers (such as TMA tensor
    /// maps, which the kernel reads from parameter space).
    ///
    /// # Safety
    /// `kernel`'s PTX signature is `(P, u64 * pointers.len(), T)`; as [`Self::launch`]
    /// for the memory the parameters describe.
    pub(crate) unsafe fn launch_with_last<P: Copy, T: Copy>(
        &self,
        kernel: &'static str,
        cfg: LaunchConfig,
        params: &P,
        pointers: &[u64],
        last: &T,
    ) -> Result<()> {
        let f = self.function(kernel, cfg.shared_bytes)?;
        let mut slots: Vec<*mut c_void> = Vec::with_capacity(2 + pointers.len());
        slots.push(params as *const P as *mut c_void);
        for p in pointers {
            slots.push(p as *const u64 as *mut c_void);
        }
        slots.push(last as *const T as *mut c_void);
        self.launch_slots(kernel, f, cfg, &mut slots, false)
    }

    /// Launches `f` with the parameter slots `slots` (a pointer to each parameter's value),
    /// as a cooperative launch or not.
    fn launch_slots(
        &self,
        kernel: &'static str,
        f: Function,
        cfg: LaunchConfig,
        slots: &mut [*mut c_void],
        cooperative: bool,
    ) -> Result<()> {
        self.ctx
            .bind_to_thread()
            .map_err(|e| Error::driver("cuCtxSetCurrent", e))?;
        // SAFETY: `slots` holds a pointer to a live value for each of the kernel's
        // parameters, in order and of their types (the callers' contracts).
        unsafe {
            let launch = if cooperative {
                result::launch_cooperative_kernel
            } else {
                result::launch_kernel
            };
            launch(
                f.0,
                (cfg.grid, cfg.grid_y, 1),
                (cfg.block, 1, 1),
                cfg.shared_bytes,
                self.stream.cu_stream(),
                slots,
            )
        }
        .map_err(|e| Error::ExecutionFailed {
            kernel: kernel.to_string(),
            message: format!("{e:?}"),
        })
    }

    /// How many blocks of `block` threads with `shared_bytes` of dynamic shared memory one
    /// SM runs at once for `kernel` (cuOccupancyMaxActiveBlocksPerMultiprocessor): 0 where
    /// not one fits (then a launch so configured fails).
    pub(crate) fn resident_blocks(
        &self,
        kernel: &'static str,
        block: u32,
        shared_bytes: u32,
    ) -> Result<u32> {
        if !self.with_loaded(kernel, |entry| Ok(self.shared_fits(entry, shared_bytes)))? {
            return Ok(0);
        }
        let f = self.function(kernel, shared_bytes)?;
        self.ctx
            .bind_to_thread()
            .map_err(|e| Error::driver("cuCtxSetCurrent", e))?;
        // SAFETY: `f` is a valid function of a loaded module; the context is current.
        let n = unsafe {
            result::occupancy::max_active_block_per_multiprocessor(
                f.0,
                block as i32,
                shared_bytes as usize,
            )
        }
        .map_err(|e| Error::driver("cuOccupancyMaxActiveBlocksPerMultiprocessor", e))?;
        Ok(n.max(0) as u32)
    }

    /// Milliseconds the work `f` enqueues on the stream takes, by events around it.
    pub(crate) fn time(&self, f: impl FnOnce() -> Result<()>) -> Result<f32> {
        let event = || {
            self.ctx
                .new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))
                .map_err(|e| Error::driver("cuEventCreate", e))
        };
        let (start, end) = (event()?, event()?);
        start
            .record(&self.stream)
            .map_err(|e| Error::driver("cuEventRecord", e))?;
        f()?;
        end.record(&self.stream)
            .map_err(|e| Error::driver("cuEventRecord", e))?;
        end.synchronize()
            .map_err(|e| Error::driver("cuEventSynchronize", e))?;
        start
            .elapsed_ms(&end)
            .map_err(|e| Error::driver("cuEventElapsedTime", e))
    }

    /// Waits for the stream; reports any asynchronous failure of earlier launches.
    pub(crate) fn synchronize(&self) -> Result<()> {
        self.stream
            .synchronize()
            .map_err(|e| Error::ExecutionFailed {
                kernel: "(stream)".into(),
                message: format!("{e:?}"),
            })
    }
}

/// The device address of a buffer of a GPU handle.
pub(crate) fn device_ptr(gpu: &Gpu, buf: &Buffer) -> Result<u64> {
    match &buf.memory {
        Memory::Device(s) => Ok(s.device_ptr(&gpu.stream).0),
        Memory::Host(_) => Err(Error::bad(
            "buffer",
            "a host buffer was passed to a GPU handle",
        )),
    }
}

/// The device address of a buffer the kernel writes.
pub(crate) fn device_ptr_mut(gpu: &Gpu, buf: &mut Buffer) -> Result<u64> {
    match &mut buf.memory {
        Memory::Device(s) => Ok(s.device_ptr_mut(&gpu.stream).0),
        Memory::Host(_) => Err(Error::bad(
            "buffer",
            "a host buffer was passed to a GPU handle",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{kernels, DataType};

    /// A kernel's static shared memory counts against the 48 KB a block gets by default:
    /// dynamic shared memory that fits beside it only above that default still runs (as
    /// many blocks an SM as the memory allows), and a size past the device's limit for a
    /// block is refused by name, counting no resident blocks.
    #[test]
    fn gpu_dynamic_shared_memory_counts_the_static_beside_it() {
        let gpu = match Gpu::open(0) {
            Ok(gpu) => gpu,
            Err(e) => {
                eprintln!(
                    "skipped gpu_dynamic_shared_memory_counts_the_static_beside_it: no GPU ({e})"
                );
                return;
            }
        };
        let kernel = kernels::batch_norm_fwd_staged_rows(DataType::F32).expect("compiled");
        let static_shared = gpu.with_loaded(kernel, |e| Ok(e.static_shared)).unwrap();
        assert!(
            static_shared > 0,
            "{kernel} declares no static shared memory"
        );
        let block = 256;
        // Past 48 KB with the static memory, under it alone.
        let window = 48 * 1024 - static_shared + 16;
        let per_block = (static_shared + window + gpu.shared_reserved_per_block) as usize;
        let by_memory = gpu.shared_per_sm as usize / per_block;
        let resident = gpu.resident_blocks(kernel, block, window).unwrap() as usize;
        assert!(
            resident >= 1 && resident <= by_memory,
            "{resident} blocks an SM with {window} dynamic bytes (memory allows {by_memory})"
        );
        gpu.function(kernel, window).unwrap();

        let over = gpu.shared_per_block_optin - static_shared + 1;
        assert_eq!(gpu.resident_blocks(kernel, block, over).unwrap(), 0);
        match gpu.function(kernel, over) {
            Err(Error::NotSupported { message }) => {
                assert!(message.contains(kernel), "{message}")
            }
            other => panic!("{over} dynamic bytes: {:?}", other.map(|_| ())),
        }
        // The refusal left the allowance as it was.
        gpu.function(kernel, window).unwrap();
    }
}
