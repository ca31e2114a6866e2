/* c99_header.c - the public header compiles as strict C99 (-std=c99 -Wall -Wextra -pedantic -Werror)
 * and a C program links against libflashattn.so and calls it. Runs without a GPU. */
#include <stdio.h>
#include <string.h>

#include "flashattn.h"

int main(void) {
    flashattn_fwd_params p;
    flashattn_plan_info info;
    flashattn_handle *h = NULL;
    flashattn_status st;

    if (flashattn_version() != FLASHATTN_VERSION) return 1;
    if (flashattn_fwd_params_init(&p) != FLASHATTN_STATUS_SUCCESS) return 2;
    if (p.struct_size != sizeof p || p.window_left != -1) return 3;
    if (flashattn_plan_info_init(&info) != FLASHATTN_STATUS_SUCCESS) return 4;
    if (strcmp(flashattn_status_name(FLASHATTN_STATUS_BAD_SHAPE), "FLASHATTN_STATUS_BAD_SHAPE") != 0) return 5;
    if (flashattn_fwd(NULL, &p, NULL, 0, NULL) != FLASHATTN_STATUS_NULL_POINTER) return 6;
    st = flashattn_handle_create(&h, 0);
    if (st != FLASHATTN_STATUS_SUCCESS && h != NULL) return 7;
    printf("libflashattn %s from C99: handle_create -> %s\n", flashattn_version_string(), flashattn_status_name(st));
    flashattn_handle_destroy(h);
    return 0;
}
