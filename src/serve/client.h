// The client side of running a model together, in one include: routing over the swarm's servers
// (routing.h), forward and backward passes of remote blocks (remote_forward.h), a range of
// remote blocks as a differentiable module (remote_sequential.h), and inference sessions over
// chains of servers that survive servers dying (inference_session.h).
//
//   auto node = dht::Node::Start(KeyPair::Generate(), {.initial_peers = {...}});  // client mode
//   auto manager = std::make_shared<SequenceManager>(**node, ClientOptions{
//       .model_name = "llama", .num_blocks = 32});
//   RemoteSequential remote(manager);
//   at::Tensor out = remote.forward(hidden);              // differentiable (autograd)
//   auto session = remote.OpenSession({.max_length = 128, .batch_size = 1});
//   Result<at::Tensor> h = session->Step(hidden_of_new_tokens);
#pragma once

#include "serve/inference_session.h"
#include "serve/remote_forward.h"
#include "serve/remote_sequential.h"
#include "serve/routing.h"
