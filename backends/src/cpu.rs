//! The CPU device. Until the Cranelift JIT lands, a compiled CPU graph is the reference interpreter over a verified
//! copy of the graph: correct and simple, and the seam the JIT's `Executable` replaces.

use crate::{Backend, BackendError, Buffer, Executable};
use kiln_jit::{Graph, HostBuffer, RngKey, interp};

const NAME: &str = "cpu";

#[derive(Debug, Default)]
pub struct CpuBackend;

struct Interpreted {
    graph: Graph,
}

impl Executable for Interpreted {
    fn run(&self, inputs: &[&Buffer], rng: &[RngKey]) -> Result<Vec<Buffer>, BackendError> {
        let host: Vec<&HostBuffer> = inputs
            .iter()
            .map(|b| match b {
                Buffer::Host(h) => h,
            })
            .collect();
        let out =
            interp::run(&self.graph, &host, rng).map_err(|reason| BackendError::Execute { device: NAME, reason })?;
        Ok(out.into_iter().map(Buffer::Host).collect())
    }
}

impl Backend for CpuBackend {
    fn name(&self) -> &'static str {
        NAME
    }

    fn compile(&self, graph: &Graph) -> Result<Box<dyn Executable>, BackendError> {
        graph.verify().map_err(|reason| BackendError::Compile { device: NAME, reason })?;
        Ok(Box::new(Interpreted { graph: graph.clone() }))
    }

    fn upload(&self, data: HostBuffer) -> Result<Buffer, BackendError> {
        Ok(Buffer::Host(data))
    }

    fn download(&self, buffer: &Buffer) -> Result<HostBuffer, BackendError> {
        match buffer {
            Buffer::Host(h) => Ok(h.clone()),
        }
    }
}
