//! oxidnn's convolution forward against cuDNN's: both libraries convolve the same device
//! buffers on the same stream, their outputs are checked against each other, then both are
//! timed, layer by layer over ResNet-50's and MobileNet's convolutions.
//!
//! ```text
//! cargo bench --features cudnn-bench --bench conv_vs_cudnn [-- FILTER]
//! ```
//!
//! * `FILTER` (optional): run only the rows whose `set:layer config nN` key contains it,
//!   e.g. `res2a`, `f16.nhwc n256`, `tf32`, `mobilenet:`, `v2:block`.
//! * `OXIDNN_BENCH_QUICK=1`: a smoke test: ResNet-50 f16 NHWC and f32 NCHW at N = 32,
//!   MobileNet f16 NHWC.
//! * `OXIDNN_BENCH_CONV_N256=all`: ResNet-50 at N = 256 in every configuration (by default
//!   only f16 NHWC runs at N = 256; `none` runs none).
//! * `OXIDNN_BENCH_CONV_HEURISTIC=1`: oxidnn's algorithm from its heuristic
//!   (`get_convolution_forward_algorithm`) instead of its timed search.
//! * `OXIDNN_BENCH_CONV_SHAPES=path[,path..]`: layer sets from these files instead of the
//!   built-in `benches/shapes/{resnet50,mobilenet}.txt` (each runs f16 NHWC at N = 32 and
//!   f32 NCHW at N = 32; the set's name is the file's stem).
//! * `OXIDNN_BENCH_CSV=path`: where the CSV goes (default `conv-results.csv` in the cwd);
//!   `scripts/conv-table.py` renders it as markdown, `scripts/conv-chart.py` as a chart.
//!
//! Layer sets: `benches/shapes/resnet50.txt` (every distinct ResNet-50 v1 layer and the
//! v1.5 stride-2 3x3s, oneDNN benchdnn's `shapes_resnet_50`) and
//! `benches/shapes/mobilenet.txt` (MobileNet v1 and v2 depthwise 3x3, stride 1 and 2), one
//! benchdnn-like problem per line (`g1ic64ih56oc64kh3sh1ph1n"res2a_branch2b"`, see
//! [`Layer::parse`]), embedded at build time. The batch size comes from the configuration.
//!
//! Configurations (rows are layer x configuration): ResNet-50 in f16 NHWC (tensor cores,
//! f32 accumulation) at N = 32 and 256, bf16 NHWC, tf32 NHWC (f32 data, tf32 tensor-core
//! math on both sides) and f32 NCHW exact (FMA only: TF32 off on both sides) at N = 32;
//! MobileNet's depthwise layers at N = 64 in f32 NCHW (exact) and f16 NHWC. Filters are KCRS
//! with NCHW data and KRSC with NHWC data, as cuDNN's NCHW / NHWC filter formats.
//!
//! Algorithms: each library picks its own, once per problem and outside the timed region.
//! oxidnn by `find_convolution_forward_algorithm` (its timed search; fastest first) with the
//! largest workspace its accepted algorithms ask for; the timed calls get the workspace the
//! chosen algorithm asks for. cuDNN by `cudnnFindConvolutionForwardAlgorithmEx` on the same
//! buffers with a 1 GiB workspace, math type `CUDNN_TENSOR_OP_MATH` (f16/bf16),
//! `CUDNN_DEFAULT_MATH` (tf32 rows: cuDNN 9 allows tf32 for f32 data) or `CUDNN_FMA_MATH`
//! (f32 exact; a result reporting a tensor-op math type is skipped as well, and so are FFT
//! and Winograd, which round in their transforms: exact rows compare exact algorithms); its
//! 4 fastest successful results are re-timed as the row is (each with its own math type set
//! on the descriptor, 5 calls) and the fastest is timed, through `cudnnConvolutionForward` with the
//! whole workspace (compute type f32 everywhere). The re-timing is needed: cuDNN 9.14's
//! search ranked default-math `implicit_gemm` first for f16 1x1 layers at N = 32, which then
//! ran 5-15x slower than its tensor-core `implicit_precomp_gemm`.
//!
//! Method (as `vs_cudnn`): every timed call is bracketed by its own pair of CUDA events on
//! the handle's stream; 3 warm-up calls, then 15 timed calls per library, median reported.
//! The timed calls are queued behind a host-side stream gate and released together, so the
//! events measure device time, not host launch overhead. oxidnn and cuDNN alternate call by
//! call, and buffer sets (x, w and one y per library) rotate (at least 200 MiB and 4x the
//! L2 in all) so no call reads what the previous one left in cache. Before timing, one run
//! of each library from a poisoned output is compared: ||oxidnn - cuDNN|| / ||cuDNN||
//! above 1e-4 (f32 exact), 5e-3 (tf32) or 2e-2 (f16, bf16) is a MISMATCH (still timed,
//! left out of the geomeans). TFLOPS count 2 N K P Q (C / groups) R S; GB/s count x + w + y
//! bytes once each (the minimum traffic; the figure that matters for depthwise layers).
//! Per configuration a TOTAL row sums the times of the layers both libraries ran, and the
//! geomean of cuDNN time / oxidnn time is over the layers that passed the check.
//!
//! Where oxidnn fails on a problem (descriptor, search or call), its side is marked `error`
//! and cuDNN is still timed. Without libcudnn only oxidnn is timed; without a GPU the
//! program says why and exits 0.

mod common;

use common::cudnn::{
    cudnn_check, cudnn_dtype, cudnn_sys, gb_per_s, version_string, Cudnn, TensorDesc,
};
use common::{
    dev, dev_mut, device_address, fmt_opt, open_csv, open_gpu, poison_async, random_bytes, Args,
    Check, Context, Res, Timer,
};
use oxidnn::{
    convolution_forward, convolution_forward_output_dims, find_convolution_forward_algorithm,
    get_convolution_forward_algorithm, Buffer, ConvFwdAlgo, ConvFwdAlgoPerf, ConvMode,
    ConvolutionDescriptor, DataType, FilterDescriptor, FilterLayout, Handle, Layout, MathType,
    TensorDescriptor,
};
use std::ffi::c_void;
use std::io::Write;
use std::process::ExitCode;
use std::time::Instant;

/// Untimed calls per library before the timed ones.
const WARMUP: usize = 3;
/// Timed calls per library; the median is reported.
const RUNS: usize = 15;
/// Libraries timed side by side (oxidnn, cuDNN).
const MAX_SIDES: usize = 2;
/// Buffer sets of one problem together span at least this much (and 4x the L2).
const ROTATION_MIN_BYTES: usize = 200 << 20;
/// cuDNN's workspace (its search and its timed calls).
const CUDNN_WORKSPACE_BYTES: usize = 1 << 30;
/// cuDNN's fastest search results re-timed before one is chosen ([`cudnn_pick`]).
const CUDNN_CANDIDATES: usize = 4;
/// Timed calls per re-timed candidate (after one warm-up call); the median decides.
const CUDNN_PICK_RUNS: usize = 5;
/// The most workspace oxidnn's search is given.
const OXIDNN_MAX_WORKSPACE_BYTES: usize = 1 << 30;
/// Inputs and filters are uniform in `[-INPUT_RANGE, INPUT_RANGE]`.
const INPUT_RANGE: f32 = 1.0;

/// The layer sets, embedded so the binary runs anywhere.
const RESNET50: &str = include_str!("shapes/resnet50.txt");
const MOBILENET: &str = include_str!("shapes/mobilenet.txt");

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("conv_vs_cudnn: {e}");
            ExitCode::FAILURE
        }
    }
}

// ---------------------------------------------------------------------------------------
// Layer sets
// ---------------------------------------------------------------------------------------

/// One convolution layer (2-D), without the batch size.
#[derive(Clone, Debug, PartialEq)]
struct Layer {
    name: String,
    groups: usize,
    /// Input channels (all groups).
    c: usize,
    h: usize,
    w: usize,
    /// Output channels (all groups).
    k: usize,
    r: usize,
    s: usize,
    stride: [usize; 2],
    pad: [usize; 2],
    /// cuDNN's convention: 1 is a dense filter.
    dilation: [usize; 2],
}

impl Layer {
    /// Parses a benchdnn-like problem: `key value` pairs run together (`_` separators
    /// allowed): `g` groups (1), `ic`, `ih`, `iw` (= ih), `oc`, `kh`, `kw` (= kh), `sh` (1),
    /// `sw` (= sh), `ph` (0), `pw` (= ph), `dh` (1, dense), `dw` (= dh), `oh`/`ow` (checked
    /// against the computed output), `mb` (ignored: N comes from the configuration), and
    /// `n"name"` (the layer's name; the problem string itself when absent).
    fn parse(line: &str) -> Res<Self> {
        let bad = |why: String| format!("problem {line:?}: {why}");
        let mut values: Vec<(String, usize)> = vec![];
        let mut name = None;
        let mut rest = line.trim();
        while !rest.is_empty() {
            if let Some(r) = rest.strip_prefix('_') {
                rest = r;
                continue;
            }
            if let Some(r) = rest.strip_prefix("n\"") {
                let end = r.find('"').ok_or_else(|| bad("unterminated name".into()))?;
                name = Some(r[..end].to_string());
                rest = &r[end + 1..];
                continue;
            }
            let key_len = rest
                .find(|c: char| !c.is_ascii_lowercase())
                .unwrap_or(rest.len());
            let (key, r) = rest.split_at(key_len);
            let digits = r.find(|c: char| !c.is_ascii_digit()).unwrap_or(r.len());
            if key.is_empty() || digits == 0 {
                return Err(bad(format!("expected `key<number>` at {rest:?}")));
            }
            let value = r[..digits]
                .parse::<usize>()
                .map_err(|e| bad(format!("{key}: {e}")))?;
            if !matches!(
                key,
                "mb" | "g"
                    | "ic"
                    | "ih"
                    | "iw"
                    | "oc"
                    | "oh"
                    | "ow"
                    | "kh"
                    | "kw"
                    | "sh"
                    | "sw"
                    | "ph"
                    | "pw"
                    | "dh"
                    | "dw"
            ) {
                return Err(bad(format!("unknown key {key:?}")));
            }
            values.push((key.to_string(), value));
            rest = &r[digits..];
        }
        let get = |k: &str| values.iter().rev().find(|(key, _)| key == k).map(|v| v.1);
        let need = |k: &str| get(k).ok_or_else(|| bad(format!("missing {k}")));
        let (ih, kh) = (need("ih")?, need("kh")?);
        let (sh, ph, dh) = (
            get("sh").unwrap_or(1),
            get("ph").unwrap_or(0),
            get("dh").unwrap_or(1),
        );
        let layer = Layer {
            name: name.unwrap_or_else(|| line.trim().to_string()),
            groups: get("g").unwrap_or(1),
            c: need("ic")?,
            h: ih,
            w: get("iw").unwrap_or(ih),
            k: need("oc")?,
            r: kh,
            s: get("kw").unwrap_or(kh),
            stride: [sh, get("sw").unwrap_or(sh)],
            pad: [ph, get("pw").unwrap_or(ph)],
            dilation: [dh, get("dw").unwrap_or(dh)],
        };
        if layer.groups == 0
            || !layer.c.is_multiple_of(layer.groups)
            || !layer.k.is_multiple_of(layer.groups)
        {
            return Err(bad(format!(
                "groups {} must divide ic {} and oc {}",
                layer.groups, layer.c, layer.k
            )));
        }
        if [layer.c, layer.k, layer.h, layer.w, layer.r, layer.s]
            .into_iter()
            .chain(layer.stride)
            .chain(layer.dilation)
            .any(|v| v == 0)
        {
            return Err(bad("a size, stride or dilation is 0".into()));
        }
        let (p, q) = layer
            .output_hw()
            .ok_or_else(|| bad("the filter does not fit the padded input".into()))?;
        for (key, want) in [("oh", p), ("ow", q)] {
            if let Some(v) = get(key) {
                if v != want {
                    return Err(bad(format!("{key}{v}, but the output is {want}")));
                }
            }
        }
        Ok(layer)
    }

    /// Output height and width (`None` if the dilated filter is larger than the padded input).
    fn output_hw(&self) -> Option<(usize, usize)> {
        let out = |i: usize, k: usize, s: usize, p: usize, d: usize| {
            let span = (k - 1) * d + 1;
            (i + 2 * p).checked_sub(span).map(|v| v / s + 1)
        };
        Some((
            out(
                self.h,
                self.r,
                self.stride[0],
                self.pad[0],
                self.dilation[0],
            )?,
            out(
                self.w,
                self.s,
                self.stride[1],
                self.pad[1],
                self.dilation[1],
            )?,
        ))
    }

    fn is_depthwise(&self) -> bool {
        self.groups > 1 && self.groups == self.c && self.groups == self.k
    }

    /// `C x H x W -> K RxS sS pP` (plus groups and dilation where not 1).
    fn problem_string(&self) -> String {
        let mut s = format!(
            "{}x{}x{}->{} {}x{}",
            self.c, self.h, self.w, self.k, self.r, self.s
        );
        let pair = |v: [usize; 2]| {
            if v[0] == v[1] {
                v[0].to_string()
            } else {
                format!("{}x{}", v[0], v[1])
            }
        };
        s += &format!(" s{} p{}", pair(self.stride), pair(self.pad));
        if self.dilation != [1, 1] {
            s += &format!(" d{}", pair(self.dilation));
        }
        if self.groups > 1 {
            s += &format!(" g{}", self.groups);
        }
        s
    }
}

/// A named list of layers.
struct LayerSet {
    name: String,
    layers: Vec<Layer>,
}

impl LayerSet {
    /// One problem per line; blank lines and `#` comments are skipped.
    fn parse(name: &str, text: &str) -> Res<Self> {
        let layers = text
            .lines()
            .map(|l| l.split('#').next().unwrap_or("").trim())
            .filter(|l| !l.is_empty())
            .map(Layer::parse)
            .collect::<Res<Vec<_>>>()
            .map_err(|e| format!("layer set {name}: {e}"))?;
        Ok(Self {
            name: name.to_string(),
            layers,
        })
    }
}

// ---------------------------------------------------------------------------------------
// Configurations
// ---------------------------------------------------------------------------------------

/// Data type, layout and math of a row.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Config {
    name: &'static str,
    dtype: DataType,
    layout: Layout,
    math: MathType,
}

const F16_NHWC: Config = Config {
    name: "f16.nhwc",
    dtype: DataType::F16,
    layout: Layout::ChannelsLast,
    math: MathType::TensorOp,
};
const BF16_NHWC: Config = Config {
    name: "bf16.nhwc",
    dtype: DataType::BF16,
    layout: Layout::ChannelsLast,
    math: MathType::TensorOp,
};
const TF32_NHWC: Config = Config {
    name: "tf32.nhwc",
    dtype: DataType::F32,
    layout: Layout::ChannelsLast,
    math: MathType::Tf32,
};
const F32_NCHW: Config = Config {
    name: "f32.nchw",
    dtype: DataType::F32,
    layout: Layout::ChannelsFirst,
    math: MathType::Fma,
};

impl Config {
    fn filter_layout(self) -> FilterLayout {
        match self.layout {
            Layout::ChannelsFirst => FilterLayout::Kcrs,
            Layout::ChannelsLast => FilterLayout::Krsc,
        }
    }

    /// The relative error norm allowed between the libraries' outputs.
    fn tolerance(self) -> f64 {
        match self.math {
            MathType::Fma => 1e-4,
            MathType::Tf32 => 5e-3,
            MathType::TensorOp => 2e-2,
        }
    }

    fn cudnn_math(self) -> cudnn_sys::cudnnMathType_t {
        use cudnn_sys::cudnnMathType_t as M;
        match self.math {
            MathType::Fma => M::CUDNN_FMA_MATH,
            MathType::Tf32 => M::CUDNN_DEFAULT_MATH,
            MathType::TensorOp => M::CUDNN_TENSOR_OP_MATH,
        }
    }

    /// Whether a cuDNN search result may be timed for this configuration: exact f32 rows
    /// take neither a tensor-op (tf32) result nor the algorithms that round in their
    /// transforms (FFT, Winograd), as oxidnn's exact math runs neither.
    fn accepts_cudnn(
        self,
        m: cudnn_sys::cudnnMathType_t,
        algo: cudnn_sys::cudnnConvolutionFwdAlgo_t,
    ) -> bool {
        use cudnn_sys::cudnnConvolutionFwdAlgo_t as A;
        use cudnn_sys::cudnnMathType_t as M;
        match self.math {
            MathType::Fma => {
                matches!(m, M::CUDNN_FMA_MATH | M::CUDNN_DEFAULT_MATH)
                    && !matches!(
                        algo,
                        A::CUDNN_CONVOLUTION_FWD_ALGO_FFT
                            | A::CUDNN_CONVOLUTION_FWD_ALGO_FFT_TILING
                            | A::CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD
                            | A::CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD_NONFUSED
                    )
            }
            MathType::Tf32 | MathType::TensorOp => true,
        }
    }
}

/// One block of rows: a layer set in one configuration at one batch size.
struct Plan {
    set: usize,
    config: Config,
    n: usize,
}

/// `set:layer config nN`, the key the filter matches.
fn row_key(set: &str, layer: &str, config: Config, n: usize) -> String {
    format!("{set}:{layer} {} n{n}", config.name)
}

// ---------------------------------------------------------------------------------------
// Problems and buffers
// ---------------------------------------------------------------------------------------

/// oxidnn's descriptors of one layer in one configuration at one batch size.
struct Problem {
    layer: Layer,
    config: Config,
    n: usize,
    x: TensorDescriptor,
    y: TensorDescriptor,
    /// `K x C/g x R x S` elements, dense in the configuration's filter layout.
    w_elements: usize,
    /// oxidnn's filter and convolution descriptors, or why it refused them.
    oxidnn: Result<(FilterDescriptor, ConvolutionDescriptor), String>,
}

impl Problem {
    fn new(layer: &Layer, config: Config, n: usize) -> Res<Self> {
        let l = layer;
        let (p, q) = l.output_hw().ok_or("the filter does not fit the input")?;
        let x = TensorDescriptor::nchw_with(config.dtype, n, l.c, l.h, l.w, config.layout)
            .context("x descriptor")?;
        let y = TensorDescriptor::nchw_with(config.dtype, n, l.k, p, q, config.layout)
            .context("y descriptor")?;
        let cpg = l.c / l.groups;
        let oxidnn =
            Self::oxidnn_descriptors(l, config, &x, &y).map_err(|e| format!("oxidnn: {e}"));
        Ok(Self {
            layer: l.clone(),
            config,
            n,
            x,
            y,
            w_elements: l.k * cpg * l.r * l.s,
            oxidnn,
        })
    }

    fn oxidnn_descriptors(
        l: &Layer,
        config: Config,
        x: &TensorDescriptor,
        y: &TensorDescriptor,
    ) -> Res<(FilterDescriptor, ConvolutionDescriptor)> {
        let w = FilterDescriptor::new(
            config.dtype,
            config.filter_layout(),
            l.k,
            l.c / l.groups,
            &[l.r, l.s],
        )
        .context("filter descriptor")?;
        let mut conv = ConvolutionDescriptor::new(
            &l.pad,
            &l.stride,
            &l.dilation,
            ConvMode::CrossCorrelation,
            config.math,
        )
        .context("convolution descriptor")?;
        if l.groups > 1 {
            conv = conv.with_groups(l.groups).context("groups")?;
        }
        let dims = convolution_forward_output_dims(&conv, x, &w).context("output dims")?;
        if dims != y.dims() {
            return Err(format!(
                "output dims {dims:?}, the bench computed {:?}",
                y.dims()
            ));
        }
        Ok((w, conv))
    }

    fn dtype(&self) -> DataType {
        self.config.dtype
    }

    fn w_bytes(&self) -> usize {
        self.w_elements * self.dtype().size_bytes()
    }

    /// 2 N K P Q (C / groups) R S.
    fn flops(&self) -> f64 {
        let l = &self.layer;
        let yd = self.y.dims();
        2.0 * (self.n * l.k * yd[2] * yd[3]) as f64 * (l.c / l.groups * l.r * l.s) as f64
    }

    /// x + w + y, each once.
    fn bytes_moved(&self) -> u64 {
        (self.x.size_bytes() + self.w_bytes() + self.y.size_bytes()) as u64
    }
}

/// One set of buffers. Invariant (`Set::alloc`): `x` holds `p.x`'s span, `w` the filter's
/// `w_elements`, `y_ox` and `y_cu` `p.y`'s span.
struct Set {
    x: Buffer,
    w: Buffer,
    /// oxidnn's output.
    y_ox: Buffer,
    /// cuDNN's output.
    y_cu: Buffer,
}

impl Set {
    fn alloc(h: &Handle, p: &Problem) -> Res<Self> {
        let alloc = |d: &TensorDescriptor| h.alloc(d).context("allocating a buffer");
        Ok(Self {
            x: alloc(&p.x)?,
            w: h.alloc_bytes(p.w_bytes()).context("allocating w")?,
            y_ox: alloc(&p.y)?,
            y_cu: alloc(&p.y)?,
        })
    }

    fn bytes(&self) -> usize {
        [&self.x, &self.w, &self.y_ox, &self.y_cu]
            .iter()
            .map(|b| b.len_bytes())
            .sum()
    }
}

// ---------------------------------------------------------------------------------------
// cuDNN
// ---------------------------------------------------------------------------------------

crate::cudnn_object!(
    FilterDesc,
    cudnn_sys::cudnnFilterDescriptor_t,
    cudnnCreateFilterDescriptor,
    cudnnDestroyFilterDescriptor
);
crate::cudnn_object!(
    ConvDesc,
    cudnn_sys::cudnnConvolutionDescriptor_t,
    cudnnCreateConvolutionDescriptor,
    cudnnDestroyConvolutionDescriptor
);

/// cuDNN's descriptors of a [`Problem`].
struct CudnnProblem {
    x: TensorDesc,
    w: FilterDesc,
    conv: ConvDesc,
    y: TensorDesc,
}

impl CudnnProblem {
    fn new(p: &Problem) -> Res<Self> {
        let l = &p.layer;
        let int = |v: usize| i32::try_from(v).map_err(|_| format!("{v} does not fit cuDNN's int"));
        let filter_dims = [int(l.k)?, int(l.c / l.groups)?, int(l.r)?, int(l.s)?];
        let format = match p.config.layout {
            Layout::ChannelsFirst => cudnn_sys::cudnnTensorFormat_t::CUDNN_TENSOR_NCHW,
            Layout::ChannelsLast => cudnn_sys::cudnnTensorFormat_t::CUDNN_TENSOR_NHWC,
        };
        let w = FilterDesc::create()?;
        // SAFETY: `w` is live; `filter_dims` holds 4 values and outlives the call.
        let status = unsafe {
            cudnn_sys::cudnnSetFilterNdDescriptor(
                w.0,
                cudnn_dtype(p.dtype()),
                format,
                4,
                filter_dims.as_ptr(),
            )
        };
        cudnn_check(status, "cudnnSetFilterNdDescriptor")?;
        let (pad, stride, dilation) = (
            [int(l.pad[0])?, int(l.pad[1])?],
            [int(l.stride[0])?, int(l.stride[1])?],
            [int(l.dilation[0])?, int(l.dilation[1])?],
        );
        let conv = ConvDesc::create()?;
        // SAFETY: `conv` is live; the three arrays hold 2 values each and outlive the call.
        let status = unsafe {
            cudnn_sys::cudnnSetConvolutionNdDescriptor(
                conv.0,
                2,
                pad.as_ptr(),
                stride.as_ptr(),
                dilation.as_ptr(),
                cudnn_sys::cudnnConvolutionMode_t::CUDNN_CROSS_CORRELATION,
                cudnn_sys::cudnnDataType_t::CUDNN_DATA_FLOAT,
            )
        };
        cudnn_check(status, "cudnnSetConvolutionNdDescriptor")?;
        // SAFETY: `conv` is live.
        let status = unsafe { cudnn_sys::cudnnSetConvolutionGroupCount(conv.0, int(l.groups)?) };
        cudnn_check(status, "cudnnSetConvolutionGroupCount")?;
        let d = Self {
            x: TensorDesc::new(&p.x)?,
            w,
            conv,
            y: TensorDesc::new(&p.y)?,
        };
        d.set_math(p.config.cudnn_math())?;
        let mut out = [0i32; 4];
        // SAFETY: the descriptors are live; `out` holds the 4 dims asked for.
        let status = unsafe {
            cudnn_sys::cudnnGetConvolutionNdForwardOutputDim(
                d.conv.0,
                d.x.0,
                d.w.0,
                4,
                out.as_mut_ptr(),
            )
        };
        cudnn_check(status, "cudnnGetConvolutionNdForwardOutputDim")?;
        let want: Vec<i32> = p.y.dims().iter().map(|&v| v as i32).collect();
        if out[..] != want[..] {
            return Err(format!(
                "cuDNN's output dims {out:?}, the bench computed {want:?}"
            ));
        }
        Ok(d)
    }

    fn set_math(&self, math: cudnn_sys::cudnnMathType_t) -> Res<()> {
        // SAFETY: `conv` is live.
        let status = unsafe { cudnn_sys::cudnnSetConvolutionMathType(self.conv.0, math) };
        cudnn_check(status, "cudnnSetConvolutionMathType")
    }
}

/// The algorithm cuDNN's search chose.
#[derive(Clone, Copy)]
struct CudnnChoice {
    algo: cudnn_sys::cudnnConvolutionFwdAlgo_t,
    math: cudnn_sys::cudnnMathType_t,
    workspace_bytes: usize,
    /// The time cuDNN's search measured (us).
    find_us: f64,
}

impl CudnnChoice {
    fn name(self) -> String {
        use cudnn_sys::cudnnConvolutionFwdAlgo_t as A;
        use cudnn_sys::cudnnMathType_t as M;
        let algo = match self.algo {
            A::CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM => "implicit_gemm",
            A::CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM => "implicit_precomp_gemm",
            A::CUDNN_CONVOLUTION_FWD_ALGO_GEMM => "gemm",
            A::CUDNN_CONVOLUTION_FWD_ALGO_DIRECT => "direct",
            A::CUDNN_CONVOLUTION_FWD_ALGO_FFT => "fft",
            A::CUDNN_CONVOLUTION_FWD_ALGO_FFT_TILING => "fft_tiling",
            A::CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD => "winograd",
            A::CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD_NONFUSED => "winograd_nonfused",
            A::CUDNN_CONVOLUTION_FWD_ALGO_COUNT => "count?",
        };
        let math = match self.math {
            M::CUDNN_DEFAULT_MATH => "",
            M::CUDNN_TENSOR_OP_MATH => "+tc",
            M::CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION => "+tc_conv",
            M::CUDNN_FMA_MATH => "+fma",
        };
        format!("{algo}{math}")
    }
}

/// cuDNN's search on `set`'s buffers: its successful results that fit the workspace and the
/// configuration's math, fastest first by the search's own times.
fn cudnn_find(
    cu: &Cudnn,
    d: &CudnnProblem,
    config: Config,
    set: &mut Set,
    workspace: &mut Buffer,
) -> Res<Vec<CudnnChoice>> {
    let mut max = 0i32;
    // SAFETY: the handle is live; `max` is a valid out-pointer.
    let status =
        unsafe { cudnn_sys::cudnnGetConvolutionForwardAlgorithmMaxCount(cu.handle.0, &mut max) };
    cudnn_check(status, "cudnnGetConvolutionForwardAlgorithmMaxCount")?;
    let max = max.max(1);
    // SAFETY: the perf struct is plain old data (enums with a 0 value, numbers).
    let mut results: Vec<cudnn_sys::cudnnConvolutionFwdAlgoPerf_t> =
        vec![unsafe { std::mem::zeroed() }; max as usize];
    let mut returned = 0i32;
    let (x, w, y, ws) = (
        device_address(&set.x)?,
        device_address(&set.w)?,
        device_address(&set.y_cu)?,
        device_address(workspace)?,
    );
    let ws_bytes = workspace.len_bytes();
    // SAFETY: the descriptors are live and describe the problem; x, w and y are `set`'s live
    // buffers, which hold the spans of those descriptors (`Set::alloc`); the workspace holds
    // `ws_bytes`; `results` holds `max` entries and `returned` is a valid out-pointer; cuDNN
    // issues on the oxidnn handle's stream, the only stream that touches the buffers.
    let status = unsafe {
        cudnn_sys::cudnnFindConvolutionForwardAlgorithmEx(
            cu.handle.0,
            d.x.0,
            dev(x),
            d.w.0,
            dev(w),
            d.conv.0,
            d.y.0,
            dev_mut(y),
            max,
            &mut returned,
            results.as_mut_ptr(),
            dev_mut(ws),
            ws_bytes,
        )
    };
    cudnn_check(status, "cudnnFindConvolutionForwardAlgorithmEx")?;
    results.truncate(usize::try_from(returned).unwrap_or(0));
    let mut usable: Vec<CudnnChoice> = results
        .iter()
        .filter(|r| r.status == cudnn_sys::cudnnStatus_t::CUDNN_STATUS_SUCCESS)
        .filter(|r| r.memory <= ws_bytes && r.time >= 0.0)
        .filter(|r| config.accepts_cudnn(r.mathType, r.algo))
        .map(|r| CudnnChoice {
            algo: r.algo,
            math: r.mathType,
            workspace_bytes: r.memory,
            find_us: f64::from(r.time) * 1e3,
        })
        .collect();
    usable.sort_by(|a, b| a.find_us.total_cmp(&b.find_us));
    if usable.is_empty() {
        return Err(format!(
            "cudnnFindConvolutionForwardAlgorithmEx: no usable result among {}",
            results.len()
        ));
    }
    Ok(usable)
}

/// Re-times cuDNN's `CUDNN_CANDIDATES` fastest search results the way the row is timed
/// (each with its math type set on the descriptor, buffer sets rotating) and keeps the
/// fastest. On an H100 with cuDNN 9.14, the search ranked `implicit_gemm` (default math)
/// first for several f16 1x1 layers at N = 32, which then ran 5-15x slower than
/// `implicit_precomp_gemm` on tensor cores: the search's time is not what the call gets.
/// Leaves the winner's math type set; the note lists every candidate's times.
fn cudnn_pick(
    timer: &Timer,
    cu: &Cudnn,
    d: &CudnnProblem,
    candidates: &[CudnnChoice],
    sets: &mut [Set],
    workspace: &mut Buffer,
) -> Res<(CudnnChoice, String)> {
    let count = sets.len();
    let mut best: Option<(f64, CudnnChoice)> = None;
    let mut seen = vec![];
    for &c in candidates.iter().take(CUDNN_CANDIDATES) {
        d.set_math(c.math)?;
        let timed = timer.measure(1, 1, CUDNN_PICK_RUNS, |_, invocation| {
            run_cudnn(cu, d, c, &mut sets[invocation % count], workspace)
        });
        match timed {
            Ok(m) => {
                let us = m.median_us[0];
                seen.push(format!("{} {:.1}/{us:.1}", c.name(), c.find_us));
                if best.is_none_or(|(b, _)| us < b) {
                    best = Some((us, c));
                }
            }
            Err(e) => seen.push(format!("{} failed: {e}", c.name())),
        }
    }
    timer.synchronize()?;
    let (_, choice) = best.ok_or_else(|| format!("no search result ran: {}", seen.join(", ")))?;
    d.set_math(choice.math)?;
    Ok((
        choice,
        format!(
            "cuDNN candidates (search / re-timed us): {}",
            seen.join(", ")
        ),
    ))
}

/// A host f32 scalar for cuDNN (alpha and beta for f32, f16 and bf16 data).
#[repr(C, align(8))]
struct Scalar(f32);

impl Scalar {
    fn ptr(&self) -> *const c_void {
        std::ptr::from_ref(&self.0).cast()
    }
}

/// `y_cu = conv(x, w)` through cuDNN with the chosen algorithm.
fn run_cudnn(
    cu: &Cudnn,
    d: &CudnnProblem,
    choice: CudnnChoice,
    set: &mut Set,
    workspace: &mut Buffer,
) -> Res<()> {
    let (one, zero) = (Scalar(1.0), Scalar(0.0));
    let (x, w, y, ws) = (
        device_address(&set.x)?,
        device_address(&set.w)?,
        device_address(&set.y_cu)?,
        device_address(workspace)?,
    );
    let ws_bytes = workspace.len_bytes();
    assert!(choice.workspace_bytes <= ws_bytes);
    // SAFETY: the descriptors are live and describe the problem; x, w and y are `set`'s live
    // buffers, which hold the spans of those descriptors (`Set::alloc`); the workspace holds
    // `ws_bytes`, at least what the algorithm needs (asserted); cuDNN issues on the oxidnn handle's
    // stream, the only stream that touches them; the scalars live on the host for the call.
    let status = unsafe {
        cudnn_sys::cudnnConvolutionForward(
            cu.handle.0,
            one.ptr(),
            d.x.0,
            dev(x),
            d.w.0,
            dev(w),
            d.conv.0,
            choice.algo,
            dev_mut(ws),
            ws_bytes,
            zero.ptr(),
            d.y.0,
            dev_mut(y),
        )
    };
    cudnn_check(status, "cudnnConvolutionForward")
}

// ---------------------------------------------------------------------------------------
// oxidnn
// ---------------------------------------------------------------------------------------

/// The algorithm oxidnn chose for a problem, and the workspace it asks for.
struct OxidnnChoice {
    algo: ConvFwdAlgo,
    workspace: Option<Buffer>,
    /// What the search measured (`algo time`, fastest first), for the row's notes.
    searched: Option<String>,
}

fn algo_name(a: ConvFwdAlgo) -> String {
    format!("{a:?}")
}

/// oxidnn's choice: its timed search on set 0 (or its heuristic), then the chosen
/// algorithm's workspace.
fn oxidnn_choose(h: &Handle, p: &Problem, set: &mut Set, heuristic: bool) -> Res<OxidnnChoice> {
    let (w_desc, conv) = p.oxidnn.as_ref().map_err(Clone::clone)?;
    let accepted = get_convolution_forward_algorithm(h, &p.x, w_desc, conv, &p.y)
        .context("oxidnn get_convolution_forward_algorithm")?;
    let mut searched = None;
    let perf: ConvFwdAlgoPerf = if heuristic {
        *accepted
            .first()
            .ok_or("oxidnn get_convolution_forward_algorithm: no algorithm")?
    } else {
        let search_bytes = accepted
            .iter()
            .map(|a| a.workspace_bytes)
            .filter(|&b| b <= OXIDNN_MAX_WORKSPACE_BYTES)
            .max()
            .unwrap_or(0);
        let mut ws = h
            .alloc_bytes(search_bytes.max(1))
            .context("allocating oxidnn's search workspace")?;
        let found = find_convolution_forward_algorithm(
            h,
            &p.x,
            &set.x,
            w_desc,
            &set.w,
            conv,
            &p.y,
            &mut set.y_ox,
            Some(&mut ws),
        );
        match found {
            Ok(found) if !found.is_empty() => {
                searched = Some(
                    found
                        .iter()
                        .map(|f| {
                            format!("{} {:.1} us", algo_name(f.algo), f64::from(f.time_ms) * 1e3)
                        })
                        .collect::<Vec<_>>()
                        .join(", "),
                );
                found[0]
            }
            Ok(_) => return Err("oxidnn find_convolution_forward_algorithm: no algorithm".into()),
            // A failing search still leaves the heuristic's choice to time (and to fail on
            // its own if it is the culprit).
            Err(e) => {
                searched = Some(format!(
                    "find_convolution_forward_algorithm failed ({e}); timing the heuristic's first"
                ));
                *accepted
                    .first()
                    .ok_or("oxidnn get_convolution_forward_algorithm: no algorithm")?
            }
        }
    };
    Ok(OxidnnChoice {
        algo: perf.algo,
        workspace: alloc_workspace(h, perf.workspace_bytes)?,
        searched,
    })
}

fn alloc_workspace(h: &Handle, bytes: usize) -> Res<Option<Buffer>> {
    if bytes == 0 {
        Ok(None)
    } else {
        h.alloc_bytes(bytes)
            .map(Some)
            .context("allocating oxidnn's workspace")
    }
}

fn run_oxidnn(h: &Handle, p: &Problem, choice: &mut OxidnnChoice, set: &mut Set) -> Res<()> {
    let (w_desc, conv) = p.oxidnn.as_ref().map_err(Clone::clone)?;
    convolution_forward(
        h,
        1.0,
        &p.x,
        &set.x,
        w_desc,
        &set.w,
        conv,
        choice.algo,
        choice.workspace.as_mut(),
        0.0,
        &p.y,
        &mut set.y_ox,
    )
    .context("oxidnn convolution_forward")
}

// ---------------------------------------------------------------------------------------
// Running a row
// ---------------------------------------------------------------------------------------

struct Bench {
    cudnn: Option<Cudnn>,
    /// cuDNN's workspace, shared by every problem.
    cudnn_workspace: Option<Buffer>,
    timer: Timer,
    handle: Handle,
    rotation_bytes: usize,
    heuristic: bool,
}

/// The buffers of one problem: `sets` rotate so that no call hits in L2.
struct Group {
    p: Problem,
    sets: Vec<Set>,
    cudnn: Res<CudnnProblem>,
}

impl Group {
    fn new(b: &Bench, p: Problem) -> Res<Self> {
        let first = Set::alloc(&b.handle, &p)?;
        let count = b.rotation_bytes.div_ceil(first.bytes()).max(1);
        let mut sets = vec![first];
        for _ in 1..count {
            sets.push(Set::alloc(&b.handle, &p)?);
        }
        let dtype = p.dtype();
        let l = &p.layer;
        let seed = [l.c, l.h, l.w, l.k, l.r, l.s, l.stride[0], l.groups, p.n]
            .iter()
            .fold(dtype.size_bytes() as u64, |s, &d| {
                s.wrapping_mul(31).wrapping_add(d as u64)
            });
        let x = random_bytes(dtype, p.x.span_elements(), seed, INPUT_RANGE, 0.0);
        let w = random_bytes(dtype, p.w_elements, seed ^ 0x5555, INPUT_RANGE, 0.0);
        for set in &mut sets {
            b.handle
                .write_bytes(&mut set.x, &x)
                .context("uploading x")?;
            b.handle
                .write_bytes(&mut set.w, &w)
                .context("uploading w")?;
        }
        let cudnn = match &b.cudnn {
            Some(_) => CudnnProblem::new(&p),
            None => Err("cuDNN not loaded".into()),
        };
        Ok(Self { p, sets, cudnn })
    }
}

struct Row {
    set: String,
    layer: String,
    config: Config,
    n: usize,
    problem: String,
    flops: f64,
    bytes: u64,
    oxidnn_algo: Option<String>,
    oxidnn: Option<f64>,
    cudnn_algo: Option<String>,
    cudnn: Option<f64>,
    check: Check,
    notes: Vec<String>,
}

impl Row {
    fn ratio(&self) -> Option<f64> {
        Some(self.cudnn? / self.oxidnn?)
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Side {
    Oxidnn,
    Cudnn,
}

fn output_bytes(h: &Handle, p: &Problem, y: &Buffer) -> Res<Vec<u8>> {
    let mut bytes = h.read_bytes(y).context("reading the output")?;
    bytes.truncate(p.y.size_bytes());
    Ok(bytes)
}

/// Chooses both libraries' algorithms, checks and times one row.
fn run_row(b: &mut Bench, g: &mut Group, set_name: &str) -> Row {
    let p = &g.p;
    let mut row = Row {
        set: set_name.to_string(),
        layer: p.layer.name.clone(),
        config: p.config,
        n: p.n,
        problem: p.layer.problem_string(),
        flops: p.flops(),
        bytes: p.bytes_moved(),
        oxidnn_algo: None,
        oxidnn: None,
        cudnn_algo: None,
        cudnn: None,
        check: Check::Error,
        notes: vec![],
    };
    let s = &b.timer.stream;
    // oxidnn's algorithm.
    let mut ox = match oxidnn_choose(&b.handle, p, &mut g.sets[0], b.heuristic) {
        Ok(c) => {
            row.oxidnn_algo = Some(algo_name(c.algo));
            if let Some(searched) = &c.searched {
                row.notes.push(format!("oxidnn search: {searched}"));
            }
            Some(c)
        }
        Err(e) => {
            row.notes.push(e);
            None
        }
    };
    // cuDNN's algorithm.
    let mut cu = match (&b.cudnn, &g.cudnn, b.cudnn_workspace.as_mut()) {
        (Some(cu), Ok(d), Some(ws)) => match cudnn_find(cu, d, p.config, &mut g.sets[0], ws)
            .and_then(|found| cudnn_pick(&b.timer, cu, d, &found, &mut g.sets, ws))
        {
            Ok((c, note)) => {
                row.cudnn_algo = Some(c.name());
                row.notes.push(note);
                Some((cu, d, c, ws))
            }
            Err(e) => {
                row.notes.push(format!("cuDNN: {e}"));
                None
            }
        },
        (Some(_), Err(e), _) => {
            row.notes.push(format!("cuDNN: {e}"));
            None
        }
        _ => None,
    };
    // Check: one run of each library on set 0 from a poisoned output.
    let set0 = &mut g.sets[0];
    let ox_out = match ox.as_mut() {
        Some(c) => poison_async(s, &mut set0.y_ox)
            .and_then(|()| run_oxidnn(&b.handle, p, c, set0))
            .and_then(|()| output_bytes(&b.handle, p, &set0.y_ox)),
        None => Err("oxidnn has no algorithm".into()),
    };
    let cu_out = cu.as_mut().map(|(cu, d, c, ws)| {
        poison_async(s, &mut set0.y_cu)
            .and_then(|()| run_cudnn(cu, d, *c, set0, ws))
            .and_then(|()| output_bytes(&b.handle, p, &set0.y_cu))
    });
    let mut sides = vec![];
    match &ox_out {
        Ok(_) => sides.push(Side::Oxidnn),
        Err(e) if ox.is_some() => row.notes.push(e.clone()),
        Err(_) => {}
    }
    match &cu_out {
        Some(Ok(_)) => sides.push(Side::Cudnn),
        Some(Err(e)) => row.notes.push(e.clone()),
        None => {}
    }
    row.check = Check::compare(&ox_out, cu_out.as_ref(), p.dtype(), p.config.tolerance());
    drop((ox_out, cu_out));
    if sides.is_empty() {
        return row;
    }
    let count = g.sets.len();
    let timed = b
        .timer
        .measure(sides.len(), WARMUP, RUNS, |side, invocation| {
            let set = &mut g.sets[invocation % count];
            match (sides[side], ox.as_mut(), cu.as_mut()) {
                (Side::Oxidnn, Some(c), _) => run_oxidnn(&b.handle, p, c, set),
                (Side::Cudnn, _, Some((cu, d, c, ws))) => run_cudnn(cu, d, *c, set, ws),
                _ => Err("internal: a timed side without its algorithm".into()),
            }
        });
    match timed {
        Ok(m) => {
            for (side, us) in sides.iter().zip(&m.median_us) {
                match side {
                    Side::Oxidnn => row.oxidnn = Some(*us),
                    Side::Cudnn => row.cudnn = Some(*us),
                }
            }
            if !m.gated {
                row.notes
                    .push("stream gate timed out: times may include host launch overhead".into());
            }
        }
        Err(e) => row.notes.push(format!("timing failed: {e}")),
    }
    row
}

// ---------------------------------------------------------------------------------------
// Output
// ---------------------------------------------------------------------------------------

const CSV_HEADER: &str = "set,layer,config,n,problem,flops,bytes_moved,oxidnn_algo,oxidnn_us,oxidnn_tflops,oxidnn_gbps,cudnn_algo,cudnn_us,cudnn_tflops,cudnn_gbps,ratio_cudnn_over_oxidnn,check,rel_err";

fn tflops(flops: f64, us: Option<f64>) -> Option<f64> {
    us.map(|t| flops / (t * 1e-6) / 1e12)
}

/// The geometric mean of `v` (`None` when empty).
fn geomean(v: &[f64]) -> Option<f64> {
    (!v.is_empty()).then(|| (v.iter().map(|r| r.ln()).sum::<f64>() / v.len() as f64).exp())
}

struct Report {
    rows: Vec<Row>,
    /// Per plan: (set, config, N, first row index).
    blocks: Vec<(String, Config, usize, usize)>,
    csv: Option<(String, std::io::BufWriter<std::fs::File>)>,
}

impl Report {
    fn print_header() {
        println!(
            "{:<30} {:<9} {:>4} {:<22} {:>9} {:>6} {:>6} {:<26} {:>9} {:>6} {:>6} {:>6}  check",
            "layer",
            "config",
            "N",
            "oxidnn algo",
            "ox us",
            "TFLOPS",
            "GB/s",
            "cuDNN algo",
            "cu us",
            "TFLOPS",
            "GB/s",
            "cu/ox"
        );
    }

    fn start_block(&mut self, set: &str, config: Config, n: usize) {
        println!();
        println!("== {set} {} N={n}", config.name);
        Self::print_header();
        self.blocks
            .push((set.to_string(), config, n, self.rows.len()));
    }

    fn write_csv(&mut self, cells: &[String]) {
        if let Some((path, w)) = &mut self.csv {
            if let Err(e) = writeln!(w, "{}", cells.join(",")).and_then(|()| w.flush()) {
                eprintln!("conv_vs_cudnn: writing {path}: {e}; CSV stopped");
                self.csv = None;
            }
        }
    }

    fn add(&mut self, row: Row) {
        let (ox_tf, cu_tf) = (tflops(row.flops, row.oxidnn), tflops(row.flops, row.cudnn));
        let ox_gbps = row.oxidnn.map(|t| gb_per_s(row.bytes, t));
        let cu_gbps = row.cudnn.map(|t| gb_per_s(row.bytes, t));
        let (check, err) = row.check.label();
        let err_text = err.map_or_else(String::new, |e| format!("{e:.1e}"));
        let ox_algo = row.oxidnn_algo.as_deref().unwrap_or("error");
        let cu_algo = row.cudnn_algo.as_deref().unwrap_or("n/a");
        println!(
            "{:<30} {:<9} {:>4} {:<22} {:>9} {:>6} {:>6} {:<26} {:>9} {:>6} {:>6} {:>6}  {check} {err_text}",
            row.layer,
            row.config.name,
            row.n,
            ox_algo,
            fmt_opt(row.oxidnn, 1),
            fmt_opt(ox_tf, 1),
            fmt_opt(ox_gbps, 0),
            cu_algo,
            fmt_opt(row.cudnn, 1),
            fmt_opt(cu_tf, 1),
            fmt_opt(cu_gbps, 0),
            fmt_opt(row.ratio(), 2),
        );
        for note in &row.notes {
            println!("    - {note}");
        }
        let cell = |v: Option<f64>| v.map_or_else(String::new, |v| format!("{v:.4}"));
        let cells = vec![
            row.set.clone(),
            row.layer.clone(),
            row.config.name.to_string(),
            row.n.to_string(),
            row.problem.clone(),
            format!("{:.0}", row.flops),
            row.bytes.to_string(),
            row.oxidnn_algo.clone().unwrap_or_default(),
            cell(row.oxidnn),
            cell(ox_tf),
            cell(ox_gbps),
            row.cudnn_algo.clone().unwrap_or_default(),
            cell(row.cudnn),
            cell(cu_tf),
            cell(cu_gbps),
            cell(row.ratio()),
            check.to_string(),
            err.map_or_else(String::new, |e| format!("{e:e}")),
        ];
        self.write_csv(&cells);
        let _ = std::io::stdout().flush();
        self.rows.push(row);
    }

    /// The TOTAL and GEOMEAN lines of the last block: times summed over the layers both
    /// libraries ran, the geomean over the layers that passed the check.
    fn end_block(&mut self) {
        let Some((set, config, n, first)) = self.blocks.last().cloned() else {
            return;
        };
        let rows = &self.rows[first..];
        let both: Vec<&Row> = rows
            .iter()
            .filter(|r| r.oxidnn.is_some() && r.cudnn.is_some())
            .collect();
        let ox: f64 = both.iter().filter_map(|r| r.oxidnn).sum();
        let cu: f64 = both.iter().filter_map(|r| r.cudnn).sum();
        let flops: f64 = both.iter().map(|r| r.flops).sum();
        let bytes: u64 = both.iter().map(|r| r.bytes).sum();
        let ratios: Vec<f64> = rows
            .iter()
            .filter(|r| matches!(r.check, Check::Ok(_)))
            .filter_map(Row::ratio)
            .collect();
        let g = geomean(&ratios);
        let (ox_t, cu_t) = if both.is_empty() {
            (None, None)
        } else {
            (Some(ox), Some(cu))
        };
        let total_ratio = ox_t.zip(cu_t).map(|(o, c)| c / o);
        println!(
            "{:<30} {:<9} {:>4} {:<22} {:>9} {:>6} {:>6} {:<26} {:>9} {:>6} {:>6} {:>6}  ({} of {} layers)",
            "TOTAL",
            config.name,
            n,
            "",
            fmt_opt(ox_t, 1),
            fmt_opt(tflops(flops, ox_t), 1),
            fmt_opt(ox_t.map(|t| gb_per_s(bytes, t)), 0),
            "",
            fmt_opt(cu_t, 1),
            fmt_opt(tflops(flops, cu_t), 1),
            fmt_opt(cu_t.map(|t| gb_per_s(bytes, t)), 0),
            fmt_opt(total_ratio, 2),
            both.len(),
            rows.len()
        );
        println!(
            "{:<30} {:<9} {:>4} geomean cuDNN/oxidnn {} over {} layers that passed the check",
            "GEOMEAN",
            config.name,
            n,
            fmt_opt(g, 3),
            ratios.len()
        );
        let cell = |v: Option<f64>| v.map_or_else(String::new, |v| format!("{v:.4}"));
        let total = vec![
            set.clone(),
            "TOTAL".into(),
            config.name.into(),
            n.to_string(),
            format!("{} of {} layers", both.len(), rows.len()),
            format!("{flops:.0}"),
            bytes.to_string(),
            String::new(),
            cell(ox_t),
            cell(tflops(flops, ox_t)),
            cell(ox_t.map(|t| gb_per_s(bytes, t))),
            String::new(),
            cell(cu_t),
            cell(tflops(flops, cu_t)),
            cell(cu_t.map(|t| gb_per_s(bytes, t))),
            cell(total_ratio),
            "total".into(),
            String::new(),
        ];
        self.write_csv(&total);
        let mut geo = vec![String::new(); 18];
        geo[0] = set;
        geo[1] = "GEOMEAN".into();
        geo[2] = config.name.into();
        geo[3] = n.to_string();
        geo[4] = format!("{} layers passed", ratios.len());
        geo[15] = cell(g);
        geo[16] = "geomean".into();
        self.write_csv(&geo);
    }

    fn print_summary(&self, device: &str) {
        println!();
        println!("summary: per configuration, geomean of cuDNN time / oxidnn time (> 1: oxidnn faster) over the layers that passed the check; TOTAL: summed times");
        for (i, (set, config, n, first)) in self.blocks.iter().enumerate() {
            let end = self.blocks.get(i + 1).map_or(self.rows.len(), |b| b.3);
            let rows = &self.rows[*first..end];
            let ratios: Vec<f64> = rows
                .iter()
                .filter(|r| matches!(r.check, Check::Ok(_)))
                .filter_map(Row::ratio)
                .collect();
            let both: Vec<&Row> = rows
                .iter()
                .filter(|r| r.oxidnn.is_some() && r.cudnn.is_some())
                .collect();
            let ox: f64 = both.iter().filter_map(|r| r.oxidnn).sum();
            let cu: f64 = both.iter().filter_map(|r| r.cudnn).sum();
            let (min, max) = ratios
                .iter()
                .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), &r| {
                    (a.min(r), b.max(r))
                });
            let label = format!("{set} {} N={n}", config.name);
            match geomean(&ratios) {
                Some(g) => println!(
                    "  {label:<28} {:>3} rows   geomean {g:.3} (min {min:.2}, max {max:.2})   TOTAL oxidnn {ox:.0} us, cuDNN {cu:.0} us ({:.2})",
                    ratios.len(),
                    if ox > 0.0 { cu / ox } else { f64::NAN }
                ),
                None => println!("  {label:<28} {:>3} rows   n/a", 0),
            }
        }
        let count = |f: fn(&Check) -> bool| self.rows.iter().filter(|r| f(&r.check)).count();
        println!(
            "  rows: {}, MISMATCH: {}, oxidnn errors: {}",
            self.rows.len(),
            count(|c| matches!(c, Check::Mismatch(_))),
            count(|c| matches!(c, Check::Error))
        );
        println!("  device: {device}");
        if let Some((path, _)) = &self.csv {
            println!("  CSV: {path}");
        }
    }
}

// ---------------------------------------------------------------------------------------
// main
// ---------------------------------------------------------------------------------------

fn env_flag(name: &str) -> bool {
    std::env::var(name).is_ok_and(|v| !v.is_empty() && v != "0")
}

/// The layer sets and the blocks of rows to run.
fn plans(args: &Args) -> Res<(Vec<LayerSet>, Vec<Plan>)> {
    if let Ok(paths) = std::env::var("OXIDNN_BENCH_CONV_SHAPES") {
        let mut sets = vec![];
        let mut plans = vec![];
        for path in paths.split(',').filter(|p| !p.is_empty()) {
            let text = std::fs::read_to_string(path).context(path)?;
            let name = std::path::Path::new(path)
                .file_stem()
                .map_or_else(|| path.to_string(), |s| s.to_string_lossy().into_owned());
            sets.push(LayerSet::parse(&name, &text)?);
            for config in [F16_NHWC, F32_NCHW] {
                plans.push(Plan {
                    set: sets.len() - 1,
                    config,
                    n: 32,
                });
            }
        }
        return Ok((sets, plans));
    }
    let sets = vec![
        LayerSet::parse("resnet50", RESNET50)?,
        LayerSet::parse("mobilenet", MOBILENET)?,
    ];
    let n256 = std::env::var("OXIDNN_BENCH_CONV_N256").unwrap_or_default();
    let big = |c: Config| match n256.as_str() {
        "all" => true,
        "none" | "0" => false,
        _ => c == F16_NHWC,
    };
    let mut plans = vec![];
    for config in [F16_NHWC, BF16_NHWC, TF32_NHWC, F32_NCHW] {
        if args.quick && !(config == F16_NHWC || config == F32_NCHW) {
            continue;
        }
        plans.push(Plan {
            set: 0,
            config,
            n: 32,
        });
        if big(config) && !args.quick {
            plans.push(Plan {
                set: 0,
                config,
                n: 256,
            });
        }
    }
    for config in [F32_NCHW, F16_NHWC] {
        if args.quick && config != F16_NHWC {
            continue;
        }
        plans.push(Plan {
            set: 1,
            config,
            n: 64,
        });
    }
    Ok((sets, plans))
}

/// Prints the rows the bench would run (no GPU needed): `OXIDNN_BENCH_CONV_LIST=1`.
fn list(sets: &[LayerSet], plans: &[Plan], args: &Args) {
    for plan in plans {
        let set = &sets[plan.set];
        println!("== {} {} N={}", set.name, plan.config.name, plan.n);
        for l in &set.layers {
            let key = row_key(&set.name, &l.name, plan.config, plan.n);
            if !args
                .filter
                .as_ref()
                .is_none_or(|f| key.contains(f.as_str()))
            {
                continue;
            }
            match Problem::new(l, plan.config, plan.n) {
                Ok(p) => println!(
                    "  {key:<48} {:<32} y {:?}  {:.2} GFLOP  {:.1} MB{}",
                    l.problem_string(),
                    p.y.dims(),
                    p.flops() / 1e9,
                    p.bytes_moved() as f64 / 1e6,
                    if l.is_depthwise() { "  depthwise" } else { "" }
                ),
                Err(e) => println!("  {key}: {e}"),
            }
        }
    }
}

fn run() -> Res<()> {
    let started = Instant::now();
    let args = Args::parse();
    let (sets, plans) = plans(&args)?;
    if env_flag("OXIDNN_BENCH_CONV_LIST") {
        list(&sets, &plans, &args);
        return Ok(());
    }
    let Some(gpu) = open_gpu("conv_vs_cudnn")? else {
        return Ok(());
    };
    println!("oxidnn convolution forward vs cuDNN");
    println!("{}", gpu.summary);
    let cudnn = match Cudnn::open(&gpu.stream) {
        Ok(cu) => {
            println!(
                "cuDNN {} (built for CUDA runtime {}.{})",
                version_string(cu.version),
                cu.cudart_version / 1000,
                cu.cudart_version % 1000 / 10
            );
            Some(cu)
        }
        Err(why) => {
            println!("cuDNN: NOT AVAILABLE ({why}); timing oxidnn only, outputs unchecked");
            None
        }
    };
    let cudnn_workspace = match &cudnn {
        Some(_) => Some(
            gpu.handle
                .alloc_bytes(CUDNN_WORKSPACE_BYTES)
                .context("allocating cuDNN's workspace")?,
        ),
        None => None,
    };
    let heuristic = env_flag("OXIDNN_BENCH_CONV_HEURISTIC");
    let timer = Timer::new(&gpu.stream, MAX_SIDES * RUNS)?;
    let mut bench = Bench {
        cudnn,
        cudnn_workspace,
        timer,
        handle: gpu.handle,
        rotation_bytes: ROTATION_MIN_BYTES.max(4 * gpu.l2_bytes),
        heuristic,
    };
    println!(
        "timing: CUDA events per call on the handle's stream; {WARMUP} warm-up + {RUNS} timed calls per library, median; \
         calls queued behind a stream gate (device time); oxidnn and cuDNN alternate; buffer sets rotate over >= {} MiB",
        bench.rotation_bytes >> 20
    );
    println!(
        "algorithms: oxidnn {}, cuDNN cudnnFindConvolutionForwardAlgorithmEx ({} MiB workspace); once per problem, untimed",
        if heuristic {
            "get_convolution_forward_algorithm (heuristic)"
        } else {
            "find_convolution_forward_algorithm (timed search)"
        },
        CUDNN_WORKSPACE_BYTES >> 20
    );
    if args.quick {
        println!("OXIDNN_BENCH_QUICK: ResNet-50 f16 NHWC and f32 NCHW at N=32, MobileNet f16 NHWC");
    }
    if let Some(f) = &args.filter {
        println!("filter: rows containing {f:?}");
    }
    let mut report = Report {
        rows: vec![],
        blocks: vec![],
        csv: open_csv("conv_vs_cudnn", "conv-results.csv", CSV_HEADER),
    };
    for plan in &plans {
        let set = &sets[plan.set];
        let layers: Vec<&Layer> = set
            .layers
            .iter()
            .filter(|l| {
                let key = row_key(&set.name, &l.name, plan.config, plan.n);
                args.filter
                    .as_ref()
                    .is_none_or(|f| key.contains(f.as_str()))
            })
            .collect();
        if layers.is_empty() {
            continue;
        }
        report.start_block(&set.name, plan.config, plan.n);
        for layer in layers {
            let mut group = match Problem::new(layer, plan.config, plan.n)
                .and_then(|p| Group::new(&bench, p))
            {
                Ok(g) => g,
                Err(e) => {
                    println!("    ! {}: skipped: {e}", layer.name);
                    continue;
                }
            };
            let row = run_row(&mut bench, &mut group, &set.name);
            report.add(row);
            // Outstanding work must finish before the buffers are freed.
            bench.timer.synchronize()?;
        }
        report.end_block();
    }
    if report.rows.is_empty() {
        println!("no rows match the filter");
    }
    report.print_summary(&gpu.name);
    println!("  wall time: {:.1} s", started.elapsed().as_secs_f64());
    Ok(())
}
