/* The kernels for any CPU (the compiler's baseline instruction set). */
#define KSET pyc_kernels_generic
#define KSET_NAME "generic"
#include "kernels_impl.h"

int pyc_itemsize(int dtype)
{
    switch (dtype) {
    case DT_I8: case DT_U8: case DT_BOOL: case DT_BYTE: return 1;
    case DT_F16: case DT_BF16: case DT_I16: case DT_U16: return 2;
    case DT_F32: case DT_I32: case DT_U32: return 4;
    case DT_F64: case DT_I64: case DT_U64: case DT_C64: return 8;
    case DT_C128: return 16;
    default: return 0;
    }
}
