// Shared by the GPU tests that capture calls into CUDA graphs: OwnedGraph, and the rounds of the
// tests that chain calls on one stream: the enqueued work captured into a graph (global capture
// mode), then run eagerly once and the graph replayed twice, the results checked after each
// round.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <string>

#include "latentkv/latentkv.h"

namespace latentkv::testing {

// A captured graph and its executable, destroyed with the object.
struct OwnedGraph {
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  OwnedGraph() = default;
  OwnedGraph(const OwnedGraph&) = delete;
  OwnedGraph& operator=(const OwnedGraph&) = delete;
  ~OwnedGraph() {
    if (exec != nullptr) cudaGraphExecDestroy(exec);
    if (graph != nullptr) cudaGraphDestroy(graph);
  }
};

// enqueue() -> Status puts the work on `stream`; check(round) reads the results back (round:
// "eager", "graph replay 1", "graph replay 2"). ASSERTs inside: the caller checks
// HasFatalFailure().
template <typename Enqueue, typename Check>
void eager_then_graph_replays(cudaStream_t stream, const Enqueue& enqueue, const Check& check) {
  OwnedGraph g;
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), cudaSuccess);
  const Status captured = enqueue();
  ASSERT_EQ(cudaStreamEndCapture(stream, &g.graph), cudaSuccess);
  ASSERT_TRUE(captured.ok()) << captured.message();
  ASSERT_EQ(cudaGraphInstantiate(&g.exec, g.graph, 0), cudaSuccess);
  for (int round = 0; round < 3; ++round) {
    const std::string name = round == 0 ? "eager" : "graph replay " + std::to_string(round);
    SCOPED_TRACE(name);
    if (round == 0) {
      const Status ran = enqueue();
      ASSERT_TRUE(ran.ok()) << ran.message();
    } else {
      ASSERT_EQ(cudaGraphLaunch(g.exec, stream), cudaSuccess);
    }
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    check(name);
    if (::testing::Test::HasFatalFailure()) return;
  }
}

}  // namespace latentkv::testing
