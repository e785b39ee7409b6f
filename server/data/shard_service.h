// The gRPC services of a parameter shard, over the ranges of a ShardHost:
// ParameterService for workers (push, pull) and ShardService for the
// coordinator (install, hold, members, save, retire). Callback API: one
// reactor per streaming call, nothing blocking inside a reactor;
// absl::Status becomes grpc::Status here.
#ifndef TALLY_SERVER_DATA_SHARD_SERVICE_H_
#define TALLY_SERVER_DATA_SHARD_SERVICE_H_

#include "proto/tally.grpc.pb.h"
#include "server/data/data_metrics.h"
#include "server/data/shard_host.h"

namespace tally {

// PushGradients, PullWeights and Exchange are served as raw bytes: pushes
// are read from gRPC's slices straight into the staging buffer, pulls are
// written as slices of the weights snapshot (proto/tensor_chunk.h); the
// bytes on the wire are the .proto's.
//
// PullRows and PushRows (a job's sparse table rows) are plain messages.
class ParameterServiceImpl final
    : public v1::ParameterService::WithRawCallbackMethod_PushGradients<
          v1::ParameterService::WithRawCallbackMethod_PullWeights<
              v1::ParameterService::WithRawCallbackMethod_Exchange<
                  v1::ParameterService::WithCallbackMethod_PullRows<
                      v1::ParameterService::WithCallbackMethod_PushRows<
                          v1::ParameterService::Service>>>>> {
 public:
  // `metrics` (borrowed) may be null: nothing is counted.
  ParameterServiceImpl(ShardHost* host, DataPlaneMetrics* metrics)
      : host_(host), metrics_(metrics) {}
  ParameterServiceImpl(const ParameterServiceImpl&) = delete;
  ParameterServiceImpl& operator=(const ParameterServiceImpl&) = delete;
  grpc::ServerReadReactor<grpc::ByteBuffer>* PushGradients(
      grpc::CallbackServerContext* ctx, grpc::ByteBuffer* resp) override;
  grpc::ServerWriteReactor<grpc::ByteBuffer>* PullWeights(
      grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* req) override;
  grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* Exchange(
      grpc::CallbackServerContext* ctx) override;
  grpc::ServerUnaryReactor* PullRows(grpc::CallbackServerContext* ctx,
                                     const v1::PullRowsRequest* req,
                                     v1::PullRowsResponse* resp) override;
  grpc::ServerUnaryReactor* PushRows(grpc::CallbackServerContext* ctx,
                                     const v1::PushRowsRequest* req,
                                     v1::PushRowsResponse* resp) override;

 private:
  ShardHost* host_;            // borrowed
  DataPlaneMetrics* metrics_;  // borrowed; may be null
};

class ShardServiceImpl final : public v1::ShardService::CallbackService {
 public:
  explicit ShardServiceImpl(ShardHost* host) : host_(host) {}
  ShardServiceImpl(const ShardServiceImpl&) = delete;
  ShardServiceImpl& operator=(const ShardServiceImpl&) = delete;
  grpc::ServerReadReactor<v1::InstallRangeChunk>* InstallRange(
      grpc::CallbackServerContext* ctx,
      v1::InstallRangeResponse* resp) override;
  grpc::ServerUnaryReactor* HoldRange(grpc::CallbackServerContext* ctx,
                                      const v1::HoldRangeRequest* req,
                                      v1::HoldRangeResponse* resp) override;
  grpc::ServerUnaryReactor* SetRangeMembers(
      grpc::CallbackServerContext* ctx, const v1::SetRangeMembersRequest* req,
      v1::SetRangeMembersResponse* resp) override;
  grpc::ServerUnaryReactor* RetireRange(grpc::CallbackServerContext* ctx,
                                        const v1::RetireRangeRequest* req,
                                        v1::RetireRangeResponse* resp) override;
  grpc::ServerWriteReactor<v1::SaveRangeChunk>* SaveRange(
      grpc::CallbackServerContext* ctx,
      const v1::SaveRangeRequest* req) override;
  grpc::ServerUnaryReactor* ReadTable(grpc::CallbackServerContext* ctx,
                                      const v1::ReadTableRequest* req,
                                      v1::ReadTableResponse* resp) override;
  grpc::ServerUnaryReactor* PromoteRange(
      grpc::CallbackServerContext* ctx, const v1::PromoteRangeRequest* req,
      v1::PromoteRangeResponse* resp) override;
  grpc::ServerUnaryReactor* SetRangeBackup(
      grpc::CallbackServerContext* ctx, const v1::SetRangeBackupRequest* req,
      v1::SetRangeBackupResponse* resp) override;
  grpc::ServerReadReactor<v1::ClosedStepChunk>* ApplyClosedSteps(
      grpc::CallbackServerContext* ctx,
      v1::ApplyClosedStepsResponse* resp) override;

 private:
  ShardHost* host_;  // borrowed
};

}  // namespace tally

#endif  // TALLY_SERVER_DATA_SHARD_SERVICE_H_
