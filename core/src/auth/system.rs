//! The platform acting on its own: a [`SystemActor`] runs the background passes (the
//! scheduler's and the workload pass, metering, notification delivery, the Kubernetes
//! executor's rounds). It stands for no user and has no session.
//!
//! Only [`Services::new`](crate::Services::new) makes one, and gives it to whoever builds
//! the services (the server's composition root, a test, a benchmark). The adapters reach
//! the services through `Arc<Services>` and hold no `SystemActor`, so no request handler
//! can run a pass, deliver the notification queue or report as a node.

/// Proof that the caller is the composition root's background work, not a request.
#[derive(Debug, Clone)]
pub struct SystemActor {
    _sealed: (),
}

impl SystemActor {
    pub(crate) fn new() -> Self {
        SystemActor { _sealed: () }
    }
}
