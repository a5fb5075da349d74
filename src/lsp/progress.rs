//! `$/progress` for work the server starts itself (the model loading, the workspace index):
//! a token the client is asked to create, bounded in time, and notifications sent only when
//! it did.

use tower_lsp_server::{
    lsp_types::{notification::Progress as ProgressNote, request::WorkDoneProgressCreate, *},
    Client,
};

/// A progress token the client accepted, or not (then reports go nowhere).
#[derive(Clone)]
pub struct Progress {
    client: Client,
    token: NumberOrString,
    accepted: bool,
}

impl Progress {
    /// Ask the client to create `token`; bounded like the configuration request, so that a
    /// client that never answers keeps nothing waiting longer.
    pub async fn create(client: &Client, token: &str) -> Progress {
        let token = NumberOrString::String(token.into());
        let accepted = matches!(
            tokio::time::timeout(
                super::CONFIGURATION_TIMEOUT,
                client.send_request::<WorkDoneProgressCreate>(WorkDoneProgressCreateParams {
                    token: token.clone()
                }),
            )
            .await,
            Ok(Ok(()))
        );
        Progress {
            client: client.clone(),
            token,
            accepted,
        }
    }

    pub async fn send(&self, value: WorkDoneProgress) {
        if self.accepted {
            self.client
                .send_notification::<ProgressNote>(ProgressParams {
                    token: self.token.clone(),
                    value: ProgressParamsValue::WorkDone(value),
                })
                .await;
        }
    }
}
