// Shared by the GPU tests that capture calls into CUDA graphs: OwnedGraph, programmatic_edges, and
// the rounds of the tests that chain calls on one stream: the enqueued work captured into a graph
// (global capture mode), then run eagerly once and the graph replayed twice, the results checked
// after each round.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

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

// The edges of `graph` that are programmatic (a kernel launched as a programmatic dependent of the
// kernel node before it, sm_90); -1 where the query fails. A chained-call test whose graph has none
// ran in plain stream order and proved nothing about the kernels' waits.
inline int programmatic_edges(cudaGraph_t graph) {
  size_t n = 0;
  if (cudaGraphGetEdges(graph, nullptr, nullptr, nullptr, &n) != cudaSuccess) return -1;
  std::vector<cudaGraphNode_t> from(n), to(n);
  std::vector<cudaGraphEdgeData> data(n);
  if (cudaGraphGetEdges(graph, from.data(), to.data(), data.data(), &n) != cudaSuccess) return -1;
  int count = 0;
  for (size_t i = 0; i < n; ++i) count += data[i].type == cudaGraphDependencyTypeProgrammatic;
  return count;
}

// enqueue() -> Status puts the work on `stream`; check(round) reads the results back (round:
// "eager", "graph replay 1", "graph replay 2"). ASSERTs inside: the caller checks
// HasFatalFailure().
template <typename Enqueue, typename Check>
void eager_then_graph_replays(cudaStream_t stream, const Enqueue& enqueue, const Check& check,
                              int* programmatic = nullptr) {
  OwnedGraph g;
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal), cudaSuccess);
  const Status captured = enqueue();
  ASSERT_EQ(cudaStreamEndCapture(stream, &g.graph), cudaSuccess);
  ASSERT_TRUE(captured.ok()) << captured.message();
  if (programmatic != nullptr) *programmatic = programmatic_edges(g.graph);
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
