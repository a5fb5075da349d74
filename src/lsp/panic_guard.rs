//! One request's panic stays that request's problem. tower-lsp runs handlers without catching
//! panics, so a bug in one handler would end the whole connection (and the editor's
//! completions with it); behind [`CatchPanic`] the request gets an internal-error response
//! and the server keeps serving. Fuzzing found no panic to catch (docs/reliability.md); this
//! is the guard for the ones it did not find.

use std::{
    future::Future,
    panic::AssertUnwindSafe,
    pin::Pin,
    task::{Context, Poll},
};

use futures::FutureExt;
use tower::Service;
use tower_lsp_server::jsonrpc::{Error, Request, Response};

/// Wraps an LSP service: a handler that panics answers its request (if it has an id) with
/// JSON-RPC's internal error instead of unwinding through the transport.
pub struct CatchPanic<S>(pub S);

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S> Service<Request> for CatchPanic<S>
where
    S: Service<Request, Response = Option<Response>>,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
{
    type Response = Option<Response>;
    type Error = S::Error;
    type Future = BoxFuture<Result<Option<Response>, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, req: Request) -> Self::Future {
        let id = req.id().cloned();
        let method = req.method().to_owned();
        let answer = AssertUnwindSafe(self.0.call(req)).catch_unwind();
        Box::pin(async move {
            match answer.await {
                Ok(result) => result,
                Err(_) => {
                    tracing::error!(%method, "the handler panicked; answering with an internal error");
                    let mut error = Error::internal_error();
                    error.message =
                        format!("laya: the {method} handler failed (a bug; see the server log)").into();
                    Ok(id.map(|id| Response::from_error(id, error)))
                }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tower::{service_fn, ServiceExt};

    #[tokio::test]
    async fn a_panicking_handler_answers_an_internal_error_and_the_service_goes_on() {
        let inner = service_fn(|req: Request| async move {
            if req.method() == "boom" {
                panic!("handler bug");
            }
            Ok::<_, std::convert::Infallible>(
                req.id()
                    .cloned()
                    .map(|id| Response::from_ok(id, serde_json::json!(1))),
            )
        });
        let mut svc = CatchPanic(inner);
        let call = |method: &str, id: i64| Request::build(method.to_owned()).id(id).finish();

        let r = svc
            .ready()
            .await
            .unwrap()
            .call(call("boom", 7))
            .await
            .unwrap()
            .unwrap();
        let v = serde_json::to_value(&r).unwrap();
        assert_eq!(v["id"], 7, "{v}");
        assert_eq!(v["error"]["code"], -32603, "{v}");
        assert!(v["error"]["message"].as_str().unwrap().contains("boom"), "{v}");

        // A notification that panics has no one to answer.
        let note = Request::build("boom").finish();
        assert!(svc.ready().await.unwrap().call(note).await.unwrap().is_none());

        let r = svc
            .ready()
            .await
            .unwrap()
            .call(call("fine", 8))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(serde_json::to_value(&r).unwrap()["result"], 1);
    }
}
