#include "kiln/dist/communicator.h"

namespace kiln {
namespace {

// The default preparation: nothing set up, each start a one-off all-reduce.
class OneOffAllReduce final : public PreparedAllReduce {
 public:
  OneOffAllReduce(Communicator& communicator, Tensor data) : communicator_(communicator), data_(data) {}
  std::unique_ptr<CommWork> start() override { return communicator_.all_reduce(data_, ReduceOp::Sum); }

 private:
  Communicator& communicator_;
  Tensor data_;
};

}  // namespace

std::unique_ptr<PreparedAllReduce> Communicator::prepare_all_reduce(Tensor data) {
  return std::make_unique<OneOffAllReduce>(*this, data);
}

}  // namespace kiln
