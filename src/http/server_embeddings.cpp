// POST /v1/embeddings (http/embeddings.h): the request resolved to a model
// that pools embeddings, decided and run like a completion (admission, the
// path's queue and KV gate, failover before any result), its vectors
// returned in one body. Not journaled: an embedding has no stream to resume
// and costs no more to ask for again.
#include "http/embeddings.h"
#include "http/server_impl.h"

namespace spw::http {

void HttpServer::Impl::embeddings(const Request& req, Response& res, const Principal& who) {
  (void)who;
  EmbeddingRequest er;
  if (auto e = parse_embedding_request(req.body, er)) return set_error(res, *e, options_.model_name);
  std::string route_model;
  if (auto e = resolve_model(er.model, &route_model)) return set_error(res, *e, options_.model_name);
  const std::string model = route_model.empty() ? options_.model_name : route_model;
  // The model's pooling and width, from a path that serves it.
  const gateway::ExecutionPath* serving = nullptr;
  for (const gateway::ExecutionPath& p : gateway_.paths()) {
    if (p.model == model && p.pooling != Pooling::kNone) {
      serving = &p;
      break;
    }
  }
  if (serving == nullptr) {
    ApiError e;
    e.param = "model";
    e.code = "unsupported_value";
    e.message = "model '" + model + "' does not serve embeddings: its GGUF declares no pooling type (" +
                "<arch>.pooling_type mean, cls or last, with causal attention); use a model made for embeddings";
    return set_error(res, e, options_.model_name);
  }
  if (er.dimensions && *er.dimensions != serving->embedding_dims) {
    ApiError e;
    e.param = "dimensions";
    e.code = "unsupported_value";
    e.message = "'dimensions': model '" + model + "' gives " + std::to_string(serving->embedding_dims) +
                "-dimensional embeddings and has no shortened form; omit dimensions or ask for " +
                std::to_string(serving->embedding_dims);
    return set_error(res, e, options_.model_name);
  }
  gateway::RouteRequest route;
  route.generation.pooling = serving->pooling;
  route.generation.embed_texts = std::move(er.texts);
  route.generation.embed_token_ids = std::move(er.token_ids);
  route.model = route_model;
  gateway::Refusal refusal;
  Result<gateway::Admitted> admitted = gateway_.submit(route, &refusal);
  if (!admitted.ok()) return refuse(res, admitted.status(), refusal);
  std::shared_ptr<serve::Ticket> ticket = admitted->ticket;
  req.disconnect->on_gone([this, t = ticket] {
    if (!serve::is_terminal(t->state())) gateway_.cancel(t->id());
  });
  Call c;
  c.ticket = ticket;
  fill_route(c);
  serve::RequestEvent ev;
  do {
    wait_event(c, ev);
  } while (ev.kind != serve::RequestEvent::Kind::kFinished);
  fill_times(c);
  route_headers(c, res);
  if (ev.state != serve::RequestState::kDone || !ev.embeddings) {
    const Status st = ev.status.ok() ? Status::internal("embeddings: the run ended without vectors") : ev.status;
    return set_error(res, error_for(c, st), c.model);
  }
  res.set_content(render_embeddings(*ev.embeddings, er.base64, c.model, c.info), kJson);
}

}  // namespace spw::http
