// grpc.health.v1.Health for the worker's health endpoint. (gRPC's built-in
// health service needs another service on the same server; a worker serves
// nothing else.) Reports SERVING while the process is up.
#ifndef TALLY_WORKER_HEALTH_H_
#define TALLY_WORKER_HEALTH_H_

#include "proto/health.grpc.pb.h"

namespace tally {

class HealthService final : public grpc::health::v1::Health::CallbackService {
 public:
  grpc::ServerUnaryReactor* Check(
      grpc::CallbackServerContext* ctx,
      const grpc::health::v1::HealthCheckRequest* req,
      grpc::health::v1::HealthCheckResponse* resp) override;
  grpc::ServerWriteReactor<grpc::health::v1::HealthCheckResponse>* Watch(
      grpc::CallbackServerContext* ctx,
      const grpc::health::v1::HealthCheckRequest* req) override;
};

}  // namespace tally

#endif  // TALLY_WORKER_HEALTH_H_
