//! Resolving a reference to what it names now: the digest a tag points at (pinned, so a
//! moved tag never changes what runs) and the image's config (its CUDA need). The server
//! does this once, when an image is added to a catalog.

use tessera_domain::image::{CudaVersion, ImageRef};

use crate::client::{Credentials, PullError, Session};
use crate::config::ImageConfig;

/// A reference resolved: `pinned` is `registry/repository@sha256:…` (an index's digest
/// when the tag names one).
#[derive(Debug, Clone)]
pub struct Resolved {
    pub pinned: ImageRef,
    pub config: ImageConfig,
    pub requires_cuda: Option<CudaVersion>,
}

/// Fetches `image`'s manifest (through an index, for this machine's platform) and config,
/// every byte checked against its digest.
pub async fn resolve(
    http: &reqwest::Client,
    image: &ImageRef,
    creds: Option<&Credentials>,
) -> Result<Resolved, PullError> {
    let mut session = Session::new(http, image, creds);
    let manifest = session.manifest().await?;
    let config = ImageConfig::from_document(&session.document_blob(&manifest.config).await?)?;
    Ok(Resolved {
        pinned: image.pinned(manifest.top),
        requires_cuda: CudaVersion::required_by(&config.env),
        config,
    })
}
