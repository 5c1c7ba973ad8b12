//! `Tensor`: a cheap handle to an `Arc`'d lazy node.
//!
//! Building an op allocates one node and takes no global lock, and touches no shared state but its operands'
//! reference counts: the live-node count is kept per thread (`live`). The allocation usually comes from this
//! thread's list of dead nodes (`SPARE`): a replayed step drops a whole history and records as many nodes again, so
//! recycling them skips a malloc and a free per node. A node is `Lazy` (it holds its operands) until `realize` runs
//! its graph, then `Realized` (it holds its buffer and has dropped its operands, so a training loop's history is
//! freed step by step). Dropping a long lazy chain is iterative, so it cannot overflow the stack.

use crate::args::fail;
use crate::device::Device;
use crate::error::{Error, Result};
use crate::realize;
use kiln_backends::Buffer;
use kiln_jit::{DType, Element, HostBuffer, Op, RngKey, Scalar, Shape};
use parking_lot::Mutex;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

/// A node's operands (at most three), stored inline.
pub(crate) type Srcs = smallvec::SmallVec<[Tensor; 3]>;

pub(crate) enum State {
    Lazy(Srcs),
    Realized(Arc<Buffer>),
    /// A dead node's allocation kept on this thread's `SPARE` list for the next node: no tensor refers to it.
    /// Also, while its plan runs, an input whose buffer was donated to an output (`realize/donate.rs`): no one
    /// outside that realize can reach it then.
    Spare,
}

pub(crate) struct Node {
    pub op: Op,
    pub shape: Shape,
    pub dtype: DType,
    pub device: Device,
    /// The run-time key of a `Rand` node.
    pub rng: Option<RngKey>,
    pub state: Mutex<State>,
    /// A leaf whose gradient the user asked for (`requires_grad`).
    pub leaf_grad: AtomicBool,
    /// For a node computed from tensors that require gradients: its operands, kept for `backward` even after the
    /// node is realized and its lazy history dropped. `backward` empties it (the graph is freed, as in PyTorch).
    pub grad_srcs: Option<Mutex<Srcs>>,
    /// A vector-Jacobian product of its own (`Tensor::with_grad_fn`), used by `backward` instead of the op's rule;
    /// its operands are `grad_srcs`.
    pub grad_fn: Option<crate::autograd::GradFn>,
}

impl Node {
    /// Moves the operands this node's drop would release (lazy history, autograd operands) onto `out`.
    fn take_links(&mut self, out: &mut smallvec::SmallVec<[Tensor; 8]>) {
        // Moved in order by a plain loop, not `out.extend(srcs.drain(..))`: this runs twice for every freed node
        // (once to unlink it, once more in its own drop, on empty lists), and the generic extend of a drain measured
        // ~10 ns a node more, which a realize pays for each node of the history it drops. In order, so the last
        // operand is unlinked first: for the usual left-deep chain (`y = f(y) op w`) the shared or leaf operands
        // pushed after `y` are released at once and the stack stays within its inline capacity.
        if let State::Lazy(srcs) = self.state.get_mut()
            && !srcs.is_empty()
        {
            for t in std::mem::take(srcs) {
                out.push(t);
            }
        }
        if let Some(g) = &mut self.grad_srcs {
            for t in std::mem::take(g.get_mut()) {
                out.push(t);
            }
        }
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        if matches!(self.state.get_mut(), State::Spare) {
            return; // already counted dead and unlinked when it was retired
        }
        live::add(-1);
        // Unlink operands we hold the last reference to before they drop, so each drop below is shallow. The
        // stack lives inline for shallow drops (the common case on the replay path): no allocation per node.
        let mut stack = smallvec::SmallVec::<[Tensor; 8]>::new();
        self.take_links(&mut stack);
        while let Some(mut t) = stack.pop() {
            // In place (no move of the node out of its allocation). The allocation is kept for a new node rather
            // than freed when there is room on this thread's spare list. The count is read first: `get_mut` is a
            // locked compare-and-swap, and most operands are shared (a weight, an input), which the plain load
            // rules out. A count that drops to 1 just after the load only makes this node's last drop, wherever it
            // happens, an ordinary one.
            if Arc::strong_count(&t.node) == 1
                && let Some(node) = Arc::get_mut(&mut t.node)
            {
                node.take_links(&mut stack);
                live::add(-1);
                *node.state.get_mut() = State::Spare;
                node.grad_srcs = None;
                node.grad_fn = None;
                retire(t.node);
            }
        }
    }
}

/// Most dead node allocations a thread keeps: 240 bytes each (the node and its counts), so at most about half a MiB
/// a thread (a thread that drops histories but records nothing keeps that much until it exits).
const SPARE_MAX: usize = 2048;

thread_local! {
    /// Allocations of dead nodes (state `Spare`, the only reference), reused by the next nodes this thread
    /// records. A replayed step frees its whole history and the next step records as many nodes again; going
    /// through malloc for each cost ~25 ns a node (free plus malloc), and freeing a large history at once let
    /// glibc trim the heap only to fault the pages back in while the next graph was recorded.
    static SPARE: std::cell::RefCell<Vec<Arc<Node>>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Keeps a retired node's allocation for reuse, or frees it when the list is full (or being torn down).
fn retire(node: Arc<Node>) {
    let full = SPARE
        .try_with(|s| {
            let mut s = s.borrow_mut();
            if s.len() < SPARE_MAX {
                s.push(node);
                None
            } else {
                Some(node)
            }
        })
        .unwrap_or(None);
    drop(full); // a `Spare` node's drop does nothing but free it
}

/// `node` in an allocation from this thread's spare list if it has one, else in a new one.
fn alloc_node(node: Node) -> Arc<Node> {
    live::add(1);
    let spare = SPARE.try_with(|s| s.borrow_mut().pop()).ok().flatten();
    match spare {
        Some(mut arc) => match Arc::get_mut(&mut arc) {
            Some(slot) => {
                *slot = node; // drops the spare's old fields (its `Node::drop` sees `Spare` and does nothing)
                arc
            }
            // Unreachable: spares are never shared, and `retire` takes no node with weak handles.
            None => Arc::new(node),
        },
        None => Arc::new(node),
    }
}

/// The count of live nodes (`Stats::live_nodes`), kept per thread: recording and dropping a node each changed one
/// process-wide atomic, a locked read-modify-write of a line every recording thread shares; here each thread adds
/// to its own counter with a plain load and store (it is the only writer), and a reader sums them. A node dropped
/// on another thread than the one that made it leaves one count above and one below zero: the sum is right.
pub(crate) mod live {
    use parking_lot::Mutex;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicIsize, Ordering};

    /// Every thread's counter that has counted a node, and what threads that ended had left.
    static COUNTERS: Mutex<Vec<Arc<AtomicIsize>>> = Mutex::new(Vec::new());
    static ENDED: AtomicIsize = AtomicIsize::new(0);

    /// A thread's counter; at the thread's end its count moves to `ENDED` and the counter leaves the list.
    struct Local(Arc<AtomicIsize>);

    impl Drop for Local {
        fn drop(&mut self) {
            let mut all = COUNTERS.lock();
            ENDED.fetch_add(self.0.load(Ordering::Relaxed), Ordering::Relaxed);
            all.retain(|c| !Arc::ptr_eq(c, &self.0));
        }
    }

    thread_local! {
        static LOCAL: Local = {
            let c = Arc::new(AtomicIsize::new(0));
            COUNTERS.lock().push(c.clone());
            Local(c)
        };
    }

    /// Adds `d` to this thread's count (to the ended threads' one while this thread is being torn down).
    pub(crate) fn add(d: isize) {
        let own = LOCAL.try_with(|l| {
            // This thread is the counter's only writer: no read-modify-write needed.
            l.0.store(l.0.load(Ordering::Relaxed) + d, Ordering::Relaxed);
        });
        if own.is_err() {
            ENDED.fetch_add(d, Ordering::Relaxed);
        }
    }

    /// Nodes alive now, over every thread (exact when no other thread is recording or dropping nodes meanwhile;
    /// a read racing them may see a count below zero for a moment, clamped to 0).
    pub(crate) fn count() -> usize {
        let all = COUNTERS.lock();
        let sum: isize = all.iter().map(|c| c.load(Ordering::Relaxed)).sum::<isize>() + ENDED.load(Ordering::Relaxed);
        sum.max(0) as usize
    }
}

/// A lazily evaluated n-dimensional array on one device. Cloning is cheap (an `Arc` clone).
#[derive(Clone)]
pub struct Tensor {
    pub(crate) node: Arc<Node>,
}

/// A handle that does not keep its node alive (`std::sync::Weak`): for a gradient function that reads tensors
/// recorded after its own node, which strong handles would tie into a cycle that outlives every user handle. A
/// node with weak handles is never recycled for another (`Arc::get_mut` refuses it), so an upgrade gives the same
/// node or nothing.
#[derive(Clone)]
pub(crate) struct WeakTensor(std::sync::Weak<Node>);

impl WeakTensor {
    /// The tensor, while any strong handle holds it.
    pub(crate) fn upgrade(&self) -> Option<Tensor> {
        self.0.upgrade().map(|node| Tensor { node })
    }
}

impl Tensor {
    /// Records a node on its operands' device (every caller passes at least one operand; a node without any, a
    /// constant or a random draw, names its device through `on_device`). Callers have checked shapes and dtypes;
    /// this checks that all operands share a device.
    #[track_caller]
    pub(crate) fn from_op(op: Op, srcs: Srcs, shape: Shape, dtype: DType) -> Tensor {
        let device = srcs[0].device();
        Self::on_device(op, srcs, shape, dtype, device, None)
    }

    #[track_caller]
    pub(crate) fn on_device(
        op: Op,
        srcs: Srcs,
        shape: Shape,
        dtype: DType,
        device: Device,
        rng: Option<RngKey>,
    ) -> Tensor {
        if let Some(other) = srcs.iter().find(|s| s.device() != device) {
            fail!(
                &op.name(),
                "operands live on different devices ({device} and {}); move one with to_device",
                other.device()
            );
        }
        if let Some(why) = device.dtype_error(dtype) {
            fail!(&op.name(), "a {dtype} result cannot live on {device}: {why}");
        }
        debug_assert_eq!(srcs.len(), op.arity());
        let grad_srcs = (crate::autograd::is_grad_enabled() && srcs.iter().any(|s| s.is_requires_grad()))
            .then(|| Mutex::new(srcs.clone()));
        Tensor {
            node: alloc_node(Node {
                op,
                shape,
                dtype,
                device,
                rng,
                state: Mutex::new(State::Lazy(srcs)),
                leaf_grad: AtomicBool::new(false),
                grad_srcs,
                grad_fn: None,
            }),
        }
    }

    /// The tensor this one broadcasts, where it is a lazy `Expand` (an index spread over the dims it does not
    /// vary along, as `index_select` records it); `None` otherwise.
    pub(crate) fn expanded_from(&self) -> Option<Tensor> {
        if !matches!(self.node.op, Op::Expand) {
            return None;
        }
        match &*self.node.state.lock() {
            State::Lazy(srcs) => srcs.first().cloned(),
            _ => None,
        }
    }

    /// A handle that does not keep this tensor alive ([`WeakTensor`]).
    pub(crate) fn downgrade(&self) -> WeakTensor {
        WeakTensor(Arc::downgrade(&self.node))
    }

    /// The same values, whose gradient `backward` sends to `inputs` through `f` (`f(g, inputs, i)`: the gradient
    /// of `inputs[i]` given this tensor's `g`, `None` for none) instead of through the ops that computed them: a
    /// composite op with a cheaper or better-fused vector-Jacobian product than its parts' (PyTorch's
    /// `autograd.Function`). Without gradient recording, or where no input requires gradients, `self`.
    pub(crate) fn with_grad_fn(&self, inputs: Srcs, f: crate::autograd::GradFn) -> Tensor {
        if !crate::autograd::is_grad_enabled() || !inputs.iter().any(|s| s.is_requires_grad()) {
            return self.clone();
        }
        Tensor {
            node: alloc_node(Node {
                op: Op::Reshape,
                shape: self.shape().clone(),
                dtype: self.dtype(),
                device: self.device(),
                rng: None,
                state: Mutex::new(State::Lazy(smallvec::smallvec![self.clone()])),
                leaf_grad: AtomicBool::new(false),
                grad_srcs: Some(Mutex::new(inputs)),
                grad_fn: Some(f),
            }),
        }
    }

    /// A realized leaf over `buffer`.
    pub(crate) fn from_buffer(buffer: Arc<Buffer>, shape: Shape, device: Device) -> Tensor {
        let dtype = buffer.dtype();
        Tensor {
            node: alloc_node(Node {
                op: Op::Input { slot: 0 },
                shape,
                dtype,
                device,
                rng: None,
                state: Mutex::new(State::Realized(buffer)),
                leaf_grad: AtomicBool::new(false),
                grad_srcs: None,
                grad_fn: None,
            }),
        }
    }

    /// A tensor holding `data` (row-major) with `shape`. A length that does not match the shape is an error. The
    /// values are copied once, into storage that starts on a 64-byte boundary as the kernels want it
    /// (`kiln_jit::HostVec`); a `Vec` is only aligned for its element type.
    pub fn from_vec<T: Element>(data: Vec<T>, shape: impl Into<Shape>, device: &Device) -> Result<Tensor> {
        Self::upload("from_vec", T::into_buffer(data), shape.into(), device)
    }

    /// Like `from_vec`, copying from a slice.
    pub fn from_slice<T: Element>(data: &[T], shape: impl Into<Shape>, device: &Device) -> Result<Tensor> {
        Self::upload("from_slice", T::copy_into_buffer(data), shape.into(), device)
    }

    /// A tensor from a typed host buffer (row-major).
    pub fn from_host(data: HostBuffer, shape: impl Into<Shape>, device: &Device) -> Result<Tensor> {
        Self::upload("from_host", data, shape.into(), device)
    }

    fn upload(op: &'static str, data: HostBuffer, shape: Shape, device: &Device) -> Result<Tensor> {
        if data.len() != shape.numel() {
            return Err(Error::DataLength { op, len: data.len(), expected: shape.numel(), shape: shape.to_vec() });
        }
        let buffer = device.backend()?.upload(data)?;
        Ok(Self::from_buffer(Arc::new(buffer), shape, *device))
    }

    /// A zero-dim tensor holding `value` as `dtype`.
    pub fn scalar(value: impl Into<Scalar>, dtype: DType, device: &Device) -> Tensor {
        Tensor::on_device(Op::Const(value.into()), crate::tensor::Srcs::new(), Shape::scalar(), dtype, *device, None)
    }

    pub fn shape(&self) -> &Shape {
        &self.node.shape
    }

    /// The dims as a slice (`shape().dims()`).
    pub fn dims(&self) -> &[usize] {
        self.node.shape.dims()
    }

    pub fn rank(&self) -> usize {
        self.node.shape.rank()
    }

    pub fn numel(&self) -> usize {
        self.node.shape.numel()
    }

    pub fn dtype(&self) -> DType {
        self.node.dtype
    }

    pub fn device(&self) -> Device {
        self.node.device
    }

    /// The node's address: its identity while the node is alive (never dereferenced through this).
    pub(crate) fn node_ptr(&self) -> *const Node {
        Arc::as_ptr(&self.node)
    }

    /// Whether this tensor's value has been computed (it then holds a buffer and no history).
    pub fn is_realized(&self) -> bool {
        matches!(*self.node.state.lock(), State::Realized(_))
    }

    /// Computes this tensor's value (a no-op if it already has one). To compute several tensors as one graph,
    /// use `kiln::realize(&[&a, &b])`.
    pub fn realize(&self) -> Result<()> {
        realize::realize(&[self])
    }

    pub(crate) fn buffer(&self) -> Result<Arc<Buffer>> {
        self.realize()?;
        match &*self.node.state.lock() {
            State::Realized(b) => Ok(b.clone()),
            State::Lazy(_) | State::Spare => unreachable!("realize leaves the node realized"),
        }
    }

    /// This realized tensor's host buffer, taken out without a copy, when `self` is the only handle to its node
    /// and no plan or other tensor shares the buffer; otherwise `self`, unchanged.
    pub(crate) fn into_unique_host(self) -> std::result::Result<HostBuffer, Tensor> {
        if Arc::strong_count(&self.node) != 1 {
            return Err(self);
        }
        let taken = {
            let mut state = self.node.state.lock();
            match &*state {
                State::Realized(b) if Arc::strong_count(b) == 1 && matches!(**b, Buffer::Host(_)) => {
                    // The node dies with `self` below; until then it holds an empty buffer of its dtype.
                    let empty = Arc::new(Buffer::Host(HostBuffer::from_f64(self.node.dtype, &[])));
                    match std::mem::replace(&mut *state, State::Realized(empty)) {
                        State::Realized(b) => Arc::try_unwrap(b).ok(),
                        _ => None,
                    }
                }
                _ => None,
            }
        };
        match taken {
            // `Buffer`'s drop returns its memory to the host pool: leave it an empty vector to return.
            Some(mut buffer @ Buffer::Host(_)) => match &mut buffer {
                Buffer::Host(h) => Ok(std::mem::replace(h, HostBuffer::U8(kiln_jit::HostVec::new()))),
                #[allow(unreachable_patterns)] // only with another device's feature on
                _ => unreachable!("matched a host buffer"),
            },
            _ => Err(self),
        }
    }

    /// The host copy of this tensor's data, row-major.
    pub fn to_host(&self) -> Result<HostBuffer> {
        let buffer = self.buffer()?;
        Ok(self.device().backend()?.download(&buffer)?)
    }

    /// The elements, row-major. `T` must be this tensor's dtype (no silent conversion).
    pub fn to_vec<T: Element>(&self) -> Result<Vec<T>> {
        if T::DTYPE != self.dtype() {
            return Err(Error::DType { op: "to_vec", actual: self.dtype(), requested: T::DTYPE });
        }
        let host = self.to_host()?;
        Ok(T::from_buffer(&host).expect("buffer dtype matches node dtype").to_vec())
    }

    /// This tensor on `device`: the same tensor if it is already there, else a copy through host memory (realizing
    /// this one first). The only way data crosses devices.
    pub fn to_device(&self, device: &Device) -> Result<Tensor> {
        if self.device() == *device {
            return Ok(self.clone());
        }
        let host = self.to_host()?;
        Self::upload("to_device", host, self.shape().clone(), device)
    }

    /// The single element of a one-element tensor.
    pub fn item<T: Element>(&self) -> Result<T> {
        if self.numel() != 1 {
            return Err(Error::NotOneElement { shape: self.dims().to_vec(), numel: self.numel() });
        }
        Ok(self.to_vec::<T>()?[0])
    }
}

impl fmt::Debug for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = if self.is_realized() { "realized" } else { "lazy" };
        write!(f, "Tensor({}{}, {}, {}, {state})", self.dtype(), self.shape(), self.device(), self.node.op)
    }
}

#[cfg(all(test, feature = "cpu"))]
mod tests {
    use super::*;

    #[test]
    fn a_dropped_history_is_recycled_for_new_nodes() {
        let x = Tensor::from_vec(vec![0.5f32], [1], &Device::cpu()).expect("upload");
        let a = x.exp();
        let a_at = Arc::as_ptr(&a.node);
        let b = a.exp();
        drop(a); // now only `b` refers to it
        drop(b); // `b` is freed; `a`, unlinked by `b`'s drop, goes to this thread's spare list
        let c = x.sin();
        assert_eq!(Arc::as_ptr(&c.node), a_at, "the spare allocation is reused");
        assert!(!c.is_realized());
        assert_eq!(c.item::<f32>().expect("value"), 0.5f32.sin());
    }
}
