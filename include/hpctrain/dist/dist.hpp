#pragma once
// The distributed runtime in one include: rendezvous and process groups, collectives, gradient sync.
#include <hpctrain/dist/collectives.hpp>
#include <hpctrain/dist/gradient_sync.hpp>
#include <hpctrain/dist/process_group.hpp>
