#pragma once
// The training loop's former home: `train()` and TrainResult now live in train/trainer.hpp, split into
// named phases. Kept so that code including <hpctrain/train/loop.hpp> compiles unchanged.
#include <hpctrain/train/trainer.hpp>
