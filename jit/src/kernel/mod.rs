//! From graph to kernels: fusion and scheduling (`schedule`), lowering to the target-neutral kernel IR (`lower`,
//! `ir`, `index`), splitting a large reduction to one value over the cores (`split`), and a host evaluator of that IR
//! (`eval`), which is the reference every renderer is held to.

mod donate;
pub mod eval;
pub mod fault;
pub mod gemm;
pub mod index;
pub mod ir;
mod loop_split;
mod lower;
pub mod regions;
pub mod routine;
mod rows;
pub mod scatter;
pub mod schedule;
pub mod simplify;
pub mod sort;
pub mod split;

pub use donate::Donation;
pub use fault::{FAULT_WORDS, Fault};
pub use index::IExpr;
pub use ir::{BufParam, Inst, InstOp, KernelIr, Reduce, Valid, ValueId};
pub use schedule::{KernelPlan, Launch, ScheduleOptions, Slot, schedule, schedule_with};
