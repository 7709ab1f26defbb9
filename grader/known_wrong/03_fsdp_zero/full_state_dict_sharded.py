# replaces: full_state_dict
# loses: test_full_state_dict
# mistake: returns model.state_dict() of the FSDP model: DTensor shards (half a model on each rank), not full
#          tensors a plain model can load
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict


def full_state_dict(model):
    return model.state_dict()
