//! Geometry of the row kernels shared by the normalisation-style families (layer/RMS norm,
//! softmax): a group of whole warps per row, the row held in registers (or streamed in
//! chunks when it is too long).

/// Threads per block when each row has one warp (several rows per block). A row group of
/// several warps is a whole block.
pub const ROW_BLOCK_THREADS: u32 = 256;

/// Warps per row of the `long` (streaming) kernels.
pub const STREAM_WARPS: u32 = 16;

/// Slots (16-byte vectors, or single elements) per thread and chunk of the `long` kernels.
pub const STREAM_SLOTS: u32 = 4;

/// Slots per thread of the `vec` kernels that hold the row in registers (one entry point
/// each, `<family>_<dir>_vec<N>_<dtype>`).
pub const VEC_SLOTS: [u32; 4] = [1, 2, 4, 8];

/// Slots (single elements) per thread of the `map` kernels (`<family>_<dir>_map<N>_<dtype>`).
pub const MAP_SLOTS: [u32; 1] = [4];
