//! cuBLASLt as the CUDA device's library GEMM (`gpu_library`): opened at run time through cudarc (nothing linked;
//! `libcublasLt.so.12` or `.so` on the loader's path, as PyTorch's `nvidia-cublas` wheel or the CUDA toolkit
//! installs it), asked once per device whether it is there (cudarc panics when it calls into a library it cannot
//! find), and used through its C API: a handle and a 32 MiB workspace per device, and per problem a matmul
//! descriptor, three matrix layouts and the algorithm its heuristic picks for them.
//!
//! kiln's matrices are row-major and cuBLASLt's column-major, so `D = A B` (row-major, `m x n`) is computed as
//! `D^T = B^T A^T` in cuBLASLt's terms: its "A" is kiln's B and its "B" kiln's A, each described where it lies (a
//! row-major operand is its transpose stored column-major: no transpose flag; a column-major one takes `T`), and
//! its `n x m` column-major D is kiln's row-major output. The bias then runs along cuBLASLt's rows, which are
//! kiln's columns, as `bias[j]` does. Products accumulate in f32 (`CUBLAS_COMPUTE_32F`; f32 operands in TF32,
//! `_FAST_TF32`, only where the user allows it), bf16 and f16 operands and outputs as `CUDA_R_16BF` and
//! `CUDA_R_16F`. The activation (`relu`, or the tanh-form GELU: `gpu_library::LibAct`) is the `_RELU` / `_GELU`
//! epilogue, `_BIAS` with a bias, applied in f32 after the bias and before the output's rounding.
//!
//! Nothing here has run on a GPU yet: the race verifies the library's output against the kernel evaluator before
//! it can win, so a mistake here loses races rather than corrupting results.

use crate::gpu_library::{LibAct, LibGemm, LibOperand};
use cudarc::cublaslt::result as lt;
use cudarc::cublaslt::sys;
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr};
use kiln_jit::DType;
use std::ffi::c_void;
use std::sync::Arc;

/// What the heuristic may use as scratch: NVIDIA's recommendation for Hopper.
const WORKSPACE_BYTES: usize = 32 << 20;

/// A device's cuBLASLt: the handle and its workspace, on the device's stream.
pub(crate) struct Lt {
    handle: sys::cublasLtHandle_t,
    workspace: CudaSlice<u8>,
    stream: Arc<CudaStream>,
}

// SAFETY: a cuBLASLt handle may be used from any thread (calls on one are serialized by the device's plans, which
// queue on its one stream); the workspace is device memory used in stream order.
unsafe impl Send for Lt {}
// SAFETY: as above.
unsafe impl Sync for Lt {}

impl Lt {
    /// cuBLASLt for `stream`'s device, or why not (the library is not installed).
    pub(crate) fn open(stream: &Arc<CudaStream>) -> Result<Lt, String> {
        // SAFETY: only tries to open the library by its usual names (dlopen); no cuBLASLt call is made.
        if !unsafe { sys::is_culib_present() } {
            return Err("cuBLASLt is not installed (libcublasLt.so is not on the loader's path; the nvidia-cublas \
                        wheel or the CUDA toolkit has it)"
                .into());
        }
        stream.context().bind_to_thread().map_err(|e| e.to_string())?;
        let handle = lt::create_handle().map_err(|e| format!("cublasLtCreate: {e}"))?;
        // SAFETY: u8 has no invalid bit patterns; cuBLASLt writes its scratch before reading it.
        let workspace = match unsafe { stream.alloc::<u8>(WORKSPACE_BYTES) } {
            Ok(w) => w,
            Err(e) => {
                // SAFETY: created just above, used by nothing else.
                let _ = unsafe { lt::destroy_handle(handle) };
                return Err(format!("allocating cuBLASLt's workspace: {e}"));
            }
        };
        Ok(Lt { handle, workspace, stream: stream.clone() })
    }

    /// The descriptors and algorithm for `g`, or why cuBLASLt declines it.
    pub(crate) fn prepare(&self, g: &LibGemm) -> Result<LtGemm, String> {
        let err = |what: &'static str| move |e: lt::CublasError| format!("cuBLASLt {what} for {}: {e}", g.describe());
        let ty = |d: DType| match d {
            DType::BF16 => sys::cudaDataType::CUDA_R_16BF,
            DType::F16 => sys::cudaDataType::CUDA_R_16F,
            _ => sys::cudaDataType::CUDA_R_32F,
        };
        let mut p = LtGemm {
            desc: std::ptr::null_mut(),
            layouts: [std::ptr::null_mut(); 3],
            algo: None,
            calling: parking_lot::Mutex::new(()),
        };
        // f32 operands in TF32 only where the user allows it, as the templates (`gpu_gemm::allow_tf32`).
        let compute = if g.operands == DType::F32 && crate::gpu_gemm::allow_tf32() {
            sys::cublasComputeType_t::CUBLAS_COMPUTE_32F_FAST_TF32
        } else {
            sys::cublasComputeType_t::CUBLAS_COMPUTE_32F
        };
        p.desc = lt::create_matmul_desc(compute, sys::cudaDataType::CUDA_R_32F).map_err(err("matmul descriptor"))?;
        // cuBLASLt's A is kiln's B (`n x k` as op(A)), its B kiln's A (`k x m` as op(B)); see the module doc.
        let (la, ta) = layout(ty(g.operands), &g.b, (g.k, g.n), g.batch).map_err(err("layout of B"))?;
        p.layouts[0] = la;
        let (lb, tb) = layout(ty(g.operands), &g.a, (g.m, g.k), g.batch).map_err(err("layout of A"))?;
        p.layouts[1] = lb;
        let d = LibOperand { buf: 0, row_major: true, ld: g.n as i64, batch_stride: (g.m * g.n) as i64 };
        p.layouts[2] = layout(ty(g.out), &d, (g.m, g.n), g.batch).map_err(err("layout of D"))?.0;
        use sys::cublasLtEpilogue_t as E;
        let epilogue = match (g.bias.is_some(), g.act) {
            (false, None) => E::CUBLASLT_EPILOGUE_DEFAULT,
            (false, Some(LibAct::Relu)) => E::CUBLASLT_EPILOGUE_RELU,
            (false, Some(LibAct::GeluTanh)) => E::CUBLASLT_EPILOGUE_GELU,
            (true, None) => E::CUBLASLT_EPILOGUE_BIAS,
            (true, Some(LibAct::Relu)) => E::CUBLASLT_EPILOGUE_RELU_BIAS,
            (true, Some(LibAct::GeluTanh)) => E::CUBLASLT_EPILOGUE_GELU_BIAS,
        };
        use sys::cublasLtMatmulDescAttributes_t as A;
        // SAFETY: `p.desc` was created above; each value is the attribute's C type (cublasOperation_t and
        // cublasLtEpilogue_t are 32-bit enums, the bias's data type a cudaDataType).
        unsafe {
            set_desc(p.desc, A::CUBLASLT_MATMUL_DESC_TRANSA, &(ta as i32)).map_err(err("transpose of B"))?;
            set_desc(p.desc, A::CUBLASLT_MATMUL_DESC_TRANSB, &(tb as i32)).map_err(err("transpose of A"))?;
            set_desc(p.desc, A::CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue).map_err(err("epilogue"))?;
            if let Some((_, dtype)) = g.bias {
                set_desc(p.desc, A::CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &ty(dtype)).map_err(err("bias type"))?;
            }
        }
        let pref = lt::create_matmul_pref().map_err(err("preference"))?;
        // SAFETY: `pref` was created just above and is destroyed right after the heuristic; the layouts and the
        // descriptor are `p`'s, alive.
        let heuristic = unsafe {
            let set = lt::set_matmul_pref_attribute(
                pref,
                sys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                (&WORKSPACE_BYTES as *const usize).cast(),
                std::mem::size_of::<usize>(),
            );
            let h = set.and_then(|()| {
                lt::get_matmul_algo_heuristic(
                    self.handle,
                    p.desc,
                    p.layouts[0],
                    p.layouts[1],
                    p.layouts[2],
                    p.layouts[2],
                    pref,
                )
            });
            let _ = lt::destroy_matmul_pref(pref);
            h
        };
        p.algo = Some(heuristic.map_err(err("algorithm"))?.algo);
        Ok(p)
    }

    /// Queues `p` on the stream: `ptrs` are kiln's A, B, the bias (0 without one) and the output.
    ///
    /// # Safety
    /// Each address is live device memory of this context holding what the problem `p` was prepared for indexes.
    pub(crate) unsafe fn launch(&self, p: &LtGemm, ptrs: [u64; 4]) -> Result<(), String> {
        let algo = p.algo.as_ref().ok_or("cuBLASLt found no algorithm")?;
        self.stream.context().bind_to_thread().map_err(|e| e.to_string())?;
        let (alpha, beta) = (1.0f32, 0.0f32);
        let (ws, _guard) = self.workspace.device_ptr(&self.stream);
        // The bias pointer lives in the descriptor: one call at a time sets it and reads it.
        let _calling = p.calling.lock();
        // SAFETY: the bias pointer is a plain device address (the descriptor copies it); the handle, descriptor,
        // layouts and algorithm are live; A, B, the bias and D are the caller's (see above); cuBLASLt's A is
        // kiln's B and its B kiln's A (the module doc); C is D with beta 0 (never read).
        unsafe {
            if ptrs[2] != 0 {
                set_desc(p.desc, sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_BIAS_POINTER, &ptrs[2])
                    .map_err(|e| format!("cuBLASLt bias pointer: {e}"))?;
            }
            lt::matmul(
                self.handle,
                p.desc,
                (&alpha as *const f32).cast(),
                (&beta as *const f32).cast(),
                ptrs[1] as *const c_void,
                p.layouts[0],
                ptrs[0] as *const c_void,
                p.layouts[1],
                ptrs[3] as *const c_void,
                p.layouts[2],
                ptrs[3] as *mut c_void,
                p.layouts[2],
                algo,
                ws as *mut c_void,
                WORKSPACE_BYTES,
                self.stream.cu_stream() as sys::cudaStream_t,
            )
        }
        .map_err(|e| format!("cublasLtMatmul: {e}"))
    }
}

impl Drop for Lt {
    fn drop(&mut self) {
        // SAFETY: created by `open`, destroyed only here.
        let _ = unsafe { lt::destroy_handle(self.handle) };
    }
}

/// One problem's descriptors and algorithm.
pub(crate) struct LtGemm {
    desc: sys::cublasLtMatmulDesc_t,
    /// cuBLASLt's A (kiln's B), B (kiln's A), and C = D.
    layouts: [sys::cublasLtMatrixLayout_t; 3],
    algo: Option<sys::cublasLtMatmulAlgo_t>,
    /// Held from setting the bias pointer to the call that reads it (two runs of one plan may launch at once).
    calling: parking_lot::Mutex<()>,
}

// SAFETY: descriptors are plain host objects cuBLASLt reads during a call; the only one written after `prepare`
// (the bias pointer) is written and read under `calling`.
unsafe impl Send for LtGemm {}
// SAFETY: as above.
unsafe impl Sync for LtGemm {}

impl Drop for LtGemm {
    fn drop(&mut self) {
        // SAFETY: each was created by `prepare` (or is null) and is destroyed only here.
        unsafe {
            for l in self.layouts {
                if !l.is_null() {
                    let _ = lt::destroy_matrix_layout(l);
                }
            }
            if !self.desc.is_null() {
                let _ = lt::destroy_matmul_desc(self.desc);
            }
        }
    }
}

/// Sets descriptor attribute `attr` to `value`.
///
/// # Safety
/// `desc` is live and `T` is the attribute's C type.
unsafe fn set_desc<T>(
    desc: sys::cublasLtMatmulDesc_t,
    attr: sys::cublasLtMatmulDescAttributes_t,
    value: &T,
) -> Result<(), lt::CublasError> {
    // SAFETY: the caller's contract.
    unsafe { lt::set_matmul_desc_attribute(desc, attr, (value as *const T).cast(), std::mem::size_of::<T>()) }
}

/// The column-major layout of kiln's `rows x cols` operand `op` as cuBLASLt's operand of the transposed product
/// (`cols x rows` after its op), and whether that op transposes: a row-major operand is its transpose stored
/// column-major (`cols x rows`, leading dimension `ld`, no op); a column-major one is itself (`rows x cols`), taken
/// transposed. Batches as `batch` entries `batch_stride` apart.
fn layout(
    ty: sys::cudaDataType,
    op: &LibOperand,
    (rows, cols): (usize, usize),
    batch: usize,
) -> Result<(sys::cublasLtMatrixLayout_t, bool), lt::CublasError> {
    let (r, c, transposed) = if op.row_major { (cols, rows, false) } else { (rows, cols, true) };
    let l = lt::create_matrix_layout(ty, r as u64, c as u64, op.ld)?;
    if batch > 1 {
        use sys::cublasLtMatrixLayoutAttribute_t as L;
        let count = batch as i32;
        // SAFETY: `l` was created just above; the batch count is an int32_t and the stride an int64_t.
        let set = unsafe {
            lt::set_matrix_layout_attribute(l, L::CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, (&count as *const i32).cast(), 4)
                .and_then(|()| {
                    lt::set_matrix_layout_attribute(
                        l,
                        L::CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                        (&op.batch_stride as *const i64).cast(),
                        8,
                    )
                })
        };
        if let Err(e) = set {
            // SAFETY: created just above, used by nothing else.
            let _ = unsafe { lt::destroy_matrix_layout(l) };
            return Err(e);
        }
    }
    Ok((l, transposed))
}
