/* moec/moec.h: the umbrella header of libmoec, the MoE compiler library.
 * Include this to use the whole public API: context and diagnostics, the IR,
 * the .moe frontend, passes and pipelines, runtime tensors, the reference
 * interpreter, checkpoint/npy I/O, and the host and TCP backends. */
#ifndef MOEC_MOEC_H
#define MOEC_MOEC_H

#include "moec/base.h"
#include "moec/ir.h"
#include "moec/frontend.h"
#include "moec/passes.h"
#include "moec/runtime.h"
#if __has_include("moec/io.h")
#include "moec/io.h"
#endif
#if __has_include("moec/backend.h")
#include "moec/backend.h"
#endif
#if __has_include("moec/tcp.h")
#include "moec/tcp.h"
#endif

#endif
